//! The `dlock` command; everything is in the `dlock_cli` library.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = dlock_cli::Cli::parse();
    cli.init_tracing();
    // On a worker thread of the runtime, not in the main thread's `block_on`: the workers
    // drive the sockets, and a future polled on the main thread waits for a worker to wake
    // it after every reply (tens of microseconds on a small machine), which `dlock bench`
    // would count as the lock's own time, and a peer's spawned tasks would not.
    match tokio::spawn(dlock_cli::run(cli)).await {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("dlock: {e}");
            std::process::ExitCode::from(101)
        }
    }
}
