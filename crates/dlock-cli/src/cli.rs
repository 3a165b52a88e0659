//! The command line: the subcommands and their options as clap reads them, and the run of one.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::{
    BenchOpts, BenchWorkerOpts, ElectOpts, RunOpts, StatusOpts, TortureOpts, TortureWorkerOpts,
};

/// dlock: distributed locks from the shell.
///
/// The store is chosen by URL: `--url`, else `DLOCK_URL`, else the embedded SQLite file in your
/// state directory (`$XDG_STATE_HOME/dlock/locks.db`), which needs no server.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Show the library's tracing on stderr: -v info, -vv debug, -vvv trace (RUST_LOG, when
    /// set, decides instead).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Sends the library's tracing to stderr, as `-v` or `RUST_LOG` asks (nothing otherwise).
    pub fn init_tracing(&self) {
        let filter = match std::env::var("RUST_LOG") {
            Ok(spec) if !spec.trim().is_empty() => tracing_subscriber::EnvFilter::new(spec),
            _ => {
                let level = match self.verbose {
                    0 => return,
                    1 => "info",
                    2 => "debug",
                    _ => "trace",
                };
                let crates = [
                    "dlock",
                    "dlock_core",
                    "dlock_cli",
                    "dlock_memory",
                    "dlock_redis",
                    "dlock_zookeeper",
                    "dlock_sql",
                    "dlock_etcd",
                    "dlock_proxy",
                ];
                let spec: Vec<String> = crates.iter().map(|c| format!("{c}={level}")).collect();
                tracing_subscriber::EnvFilter::new(format!("warn,{}", spec.join(",")))
            }
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding a lock (like flock(1), across machines).
    ///
    /// The command gets the fencing token in DLOCK_FENCING_TOKEN and the lock name in DLOCK_NAME.
    /// The lease is renewed while it runs. If the lock is about to end (its renewals fail, its
    /// session is cut off), the command's process group gets SIGTERM --kill-after before the
    /// end and SIGKILL at the end, before anyone else can hold the lock; a hold found gone
    /// gets SIGKILL at once.
    ///
    /// dlock exits with the command's status; 75 if the store answered that the lock is held
    /// and it was not had in time (-E to change); 76 if the lock was lost, or about to end,
    /// while the command ran (also when the loss is found only at the release after the
    /// command exited); 69 if the store could not be reached or did not answer (an error, not
    /// "held by someone"); 78 for a bad URL or name, a duration past what the store can hold
    /// (a lease over a year), or a --kill-after not shorter than the hold; 2 for a
    /// command line that does not parse (a malformed duration among them); 70 for a failure of
    /// dlock itself or of the store; 127 if the command is not found.
    Run(RunOpts),
    /// Run a command only while leading an election (campaigning until this process leads),
    /// or with --observe print each leader of an election as it changes.
    ///
    /// `dlock elect NAME [PROPOSAL] -- COMMAND`: campaigns with PROPOSAL (what the others read
    /// as the leader's: an address, an id; default `host:pid`); once this process leads, runs
    /// COMMAND as `dlock run` does, with the term (the leadership's fencing token, greater than
    /// every earlier leader's) in DLOCK_FENCING_TOKEN, and stops it before anyone else can
    /// lead; resigns when it exits. `dlock elect --observe NAME` prints the leader now and each
    /// change, a line each: the term and the proposal, or `none`. On etcd the election is
    /// `etcdctl elect`'s, on ZooKeeper Curator's LeaderLatch. Exit statuses as `dlock run`.
    Elect(ElectOpts),
    /// Show whether a lock is held, by whom, for how long, and its last fencing token.
    Status(StatusOpts),
    /// Compare backends: run the benchmark workloads against one or more stores.
    Bench(BenchOpts),
    /// Attack a store: worker processes contend while faults are injected (partitions,
    /// pauses past the lease, kills, resets, latency), then a checker proves the contract
    /// held: fenced writes in token order, every overlap explained by a fault and reported to
    /// its holder, progress after every fault. Exits 1 on a violation.
    Torture(TortureOpts),
    /// Print the shell completions of dlock for SHELL on standard output.
    ///
    /// bash: `dlock completions bash > ~/.local/share/bash-completion/completions/dlock`;
    /// zsh: into a directory of `$fpath` as `_dlock`; fish:
    /// `dlock completions fish > ~/.config/fish/completions/dlock.fish`.
    Completions(CompletionsOpts),
    /// Print the manual page of dlock, or of one of its subcommands, in roff on standard
    /// output (`dlock man run | man -l -`).
    Man(ManOpts),
    /// One worker process of `dlock torture` (started by it).
    #[command(hide = true)]
    TortureWorker(TortureWorkerOpts),
    /// One worker process of `dlock bench`'s workloads across processes (started by it).
    #[command(hide = true)]
    BenchWorker(BenchWorkerOpts),
    /// The reaper of `dlock run` (started by it): leads the process group the command joins,
    /// and kills it if that dlock dies without saying it is done.
    #[command(hide = true)]
    Reap(ReapOpts),
}

/// The options of `dlock reap`.
#[derive(Debug, Args)]
pub struct ReapOpts {
    /// The hold's end when the reaper starts, in nanoseconds on the host's monotonic clock:
    /// the group is killed then unless dlock says a later end first.
    #[arg(long)]
    pub until: Option<u64>,
}

/// The options of `dlock completions`.
#[derive(Debug, Args)]
pub struct CompletionsOpts {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// The options of `dlock man`.
#[derive(Debug, Args)]
pub struct ManOpts {
    /// The subcommand whose page to print (`dlock-run(1)`); without it, dlock's own page.
    pub subcommand: Option<String>,
}

/// The store to use.
#[derive(Debug, Clone, Args)]
pub struct StoreOpts {
    /// The store's URL: redis://, rediss://, redis+sentinel://, zk://, etcd://, mysql://,
    /// mariadb://, postgres://, sqlite://, memory://. Default: the embedded SQLite file. A URL
    /// with a password is better given by --url-file (argv shows in `ps`).
    #[arg(long, env = "DLOCK_URL", value_name = "URL", hide_env_values = true)]
    pub url: Option<String>,

    /// A file whose first line is the store's URL: a password then shows neither in `ps` nor
    /// in the environment. Used instead of --url (or DLOCK_URL) when both are given.
    #[arg(long, env = "DLOCK_URL_FILE", value_name = "FILE")]
    pub url_file: Option<std::path::PathBuf>,
}

impl StoreOpts {
    /// The URL to use.
    ///
    /// # Errors
    ///
    /// A message saying why the `--url-file` cannot be read.
    pub fn url(&self) -> Result<String, String> {
        if let Some(file) = &self.url_file {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read --url-file {}: {e}", file.display()))?;
            let first = text.lines().next().map(str::trim).unwrap_or_default();
            if first.is_empty() {
                return Err(format!(
                    "--url-file {} has no URL on its first line",
                    file.display()
                ));
            }
            return Ok(first.to_owned());
        }
        Ok(self.url.clone().unwrap_or_else(dlock::default_url))
    }

    /// [`url`](Self::url) for a subcommand: an unreadable `--url-file` is said on stderr, and
    /// is the exit status CONFIG.
    pub(crate) fn url_or_status(&self) -> Result<String, u8> {
        self.url().map_err(|e| {
            eprintln!("dlock: {e}");
            crate::exit::CONFIG
        })
    }
}

/// Parses a duration: `500ms`, `2s`, `1m30s`, `1h`, or a plain number of seconds.
///
/// # Errors
///
/// A message saying what is wrong, for clap to print.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() && (0.0..1e9).contains(&secs) {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("{text:?} is not a duration in range"));
    }
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration ({e}); write e.g. 500ms, 10s, 2m"))
}

/// Runs the command line and returns the process's exit status.
pub async fn run(cli: Cli) -> u8 {
    match cli.command {
        Command::Run(opts) => crate::run::run(opts).await,
        Command::Elect(opts) => crate::elect::elect(opts).await,
        Command::Status(opts) => crate::status::status(opts).await,
        Command::Bench(opts) => crate::bench::bench(opts).await,
        Command::Torture(opts) => crate::torture::torture(opts).await,
        Command::TortureWorker(opts) => crate::torture::worker(opts).await,
        Command::BenchWorker(opts) => crate::bench::worker(opts).await,
        Command::Reap(opts) => crate::run::reap(opts.until).await,
        Command::Completions(opts) => completions(&opts),
        Command::Man(opts) => man(&opts),
    }
}

/// `dlock completions SHELL`.
fn completions(opts: &CompletionsOpts) -> u8 {
    let mut command = <Cli as clap::CommandFactory>::command();
    let mut script = Vec::new();
    clap_complete::generate(opts.shell, &mut command, "dlock", &mut script);
    crate::output::say_bytes(&script);
    0
}

/// `dlock man [SUBCOMMAND]`.
fn man(opts: &ManOpts) -> u8 {
    let command = <Cli as clap::CommandFactory>::command();
    let page = match &opts.subcommand {
        None => command,
        Some(name) => {
            let Some(sub) = command
                .get_subcommands()
                .find(|s| s.get_name() == name && !s.is_hide_set())
            else {
                let known: Vec<&str> = command
                    .get_subcommands()
                    .filter(|s| !s.is_hide_set())
                    .map(clap::Command::get_name)
                    .collect();
                eprintln!(
                    "dlock: man: no subcommand {name:?} (known: {})",
                    known.join(", ")
                );
                return crate::exit::CONFIG;
            };
            // The page of `dlock run` is dlock-run(1), as git's are.
            let title = format!("dlock-{name}");
            sub.clone()
                .name(title.clone())
                .display_name(title)
                .version(command.get_version().unwrap_or_default().to_owned())
        }
    };
    let mut roff = Vec::new();
    if let Err(e) = clap_mangen::Man::new(page).render(&mut roff) {
        eprintln!("dlock: man: cannot render the page: {e}");
        return crate::exit::SOFTWARE;
    }
    crate::output::say_bytes(&roff);
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        for bad in ["", "-1", "soon", "10 parsecs", "1e99", "NaN"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
