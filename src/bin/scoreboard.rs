use clap::Parser;

fn main() -> std::process::ExitCode {
    lfm::cli::finish(lfm::cli::scoreboard::run(
        lfm::cli::scoreboard::Args::parse_from(lfm::cli::argv()),
    ))
}
