use clap::Parser;

fn main() -> std::process::ExitCode {
    lfm::cli::finish(lfm::cli::generate::run(
        lfm::cli::generate::Args::parse_from(lfm::cli::argv()),
    ))
}
