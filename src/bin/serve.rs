use clap::Parser;
use lfm::cli::serve::Args;

fn main() -> std::process::ExitCode {
    lfm::cli::finish(lfm::cli::serve::run(Args::parse_from(lfm::cli::argv())))
}
