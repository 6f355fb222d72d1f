use clap::Parser;

fn main() -> std::process::ExitCode {
    lfm::cli::finish(lfm::cli::quantize::run(
        lfm::cli::quantize::Args::parse_from(lfm::cli::argv()),
    ))
}
