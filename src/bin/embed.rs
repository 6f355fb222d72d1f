use clap::Parser;
use lfm::cli::embed::Args;

fn main() -> std::process::ExitCode {
    lfm::cli::finish(lfm::cli::embed::run(Args::parse_from(lfm::cli::argv())))
}
