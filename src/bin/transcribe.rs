use clap::Parser;
fn main() -> std::process::ExitCode {
    lfm::cli::finish(lfm::cli::transcribe::run(
        lfm::cli::transcribe::Args::parse_from(lfm::cli::argv()),
    ))
}
