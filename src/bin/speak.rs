use clap::Parser;

fn main() -> std::process::ExitCode {
    lfm::cli::finish(lfm::cli::speak::run(lfm::cli::speak::Args::parse_from(
        lfm::cli::argv(),
    )))
}
