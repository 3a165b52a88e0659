//! What dlock says: lines on standard output that end the program quietly when their reader
//! went away, and errors with their causes, mapped to an exit status.

use crate::exit;

/// Writes one line to standard output; see `say!`.
pub(crate) fn say_line(line: std::fmt::Arguments<'_>) {
    say_bytes(format!("{line}\n").as_bytes());
}

/// Writes `bytes` to standard output as they are, ending the program quietly if its reader
/// went away, as [`say_line`] does.
pub(crate) fn say_bytes(bytes: &[u8]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(i32::from(exit::BROKEN_PIPE))
        }
        Err(e) => {
            eprintln!("dlock: cannot write to standard output: {e}");
            std::process::exit(i32::from(exit::SOFTWARE))
        }
    }
}

/// Prints `dlock: <what>: <error>` (errors never contain passwords) and picks the exit status.
pub(crate) fn fail(what: &str, e: &dlock::Error) -> u8 {
    eprintln!("dlock: {what}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        eprintln!("  caused by: {}", dlock_core_redact(&s.to_string()));
        source = s.source();
    }
    match e {
        dlock::Error::Config { .. }
        | dlock::Error::InvalidName { .. }
        | dlock::Error::InvalidArgument { .. }
        | dlock::Error::Unsupported { .. } => exit::CONFIG,
        dlock::Error::Connection { .. } => exit::UNAVAILABLE,
        _ => exit::SOFTWARE,
    }
}

/// Client libraries may quote the URL they were given: hide any password in it.
fn dlock_core_redact(text: &str) -> String {
    text.split(' ')
        .map(dlock::redact)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_urls_in_messages() {
        assert_eq!(
            dlock_core_redact("connect to mysql://u:pw@h/db failed"),
            "connect to mysql://u:***@h/db failed"
        );
    }
}
