use clap::Parser;
use lfm::cli::ocr_layout::{run, Args};

fn main() -> std::process::ExitCode {
    lfm::cli::finish(run(Args::parse_from(lfm::cli::argv())))
}
