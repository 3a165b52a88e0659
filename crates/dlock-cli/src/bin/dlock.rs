//! The `dlock` command; everything is in the `dlock_cli` library.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = dlock_cli::Cli::parse();
    cli.init_tracing();
    std::process::ExitCode::from(dlock_cli::run(cli).await)
}
