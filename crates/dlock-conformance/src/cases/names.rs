//! Names and bad input: exact names, clear errors, never a panic.

use std::time::Duration;

use dlock_core::{DriftAllowance, Error, Lease, LockName, LockOptions};

use super::{
    ZERO, assert_busy, assert_unsupported, caps, client, clients, lock, not_applicable, refusals,
    release, take,
};
use crate::Factory;
use crate::support::Names;

/// Holds a fresh name ending in each of `suffixes`, all at once, through one client, each one
/// excluding another client; then releases them.
async fn held_at_once(f: &impl Factory, suffixes: &[&str]) {
    let [a, b] = clients(f).await;
    let names = Names::new();
    let mut guards = Vec::new();
    for s in suffixes {
        let name = names.name(s);
        guards.push(take(f, &lock(&a, &name)).await);
        assert_busy(&lock(&b, &name), "it is held").await;
    }
    for g in guards {
        release(g).await;
    }
}

/// Names are exact: case, punctuation, wildcards, brackets, unicode and prefixes all make
/// different locks, and each one excludes itself (all are held at once).
pub async fn names_are_exact_and_case_sensitive(f: &impl Factory) {
    let suffixes = [
        "Key",
        "key",
        "KEY",
        "a%",
        "a_",
        "ab",
        "a*",
        "a?",
        "a.b",
        "a/b",
        "a:b",
        "a{b}",
        "{a}b",
        "a b",
        "a'b",
        "a\"b",
        "a\\b",
        "a;b",
        "a-b",
        "a\u{e9}",
        "ae\u{301}",
        "🔒",
        "a/",
        "a//b",
        "a/./b",
        "a/../b",
        "-",
        "0",
        "x",
        "x/y",
        "x/y/z",
        "__READ__",
        "lock-",
        "_c_",
    ];
    held_at_once(f, &suffixes).await;
}

/// Names that differ only by trailing or leading spaces (the classic padded-collation pitfall)
/// are different locks, held at once.
pub async fn names_differing_by_a_trailing_space_are_distinct(f: &impl Factory) {
    let suffixes = ["pad", "pad ", "pad  ", " pad", "pad\u{a0}"];
    held_at_once(f, &suffixes).await;
}

/// A name of exactly 255 bytes works; 256 bytes is rejected before any I/O.
pub async fn longest_name_works(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let prefix = Names::new().name("");
    let name = format!("{prefix}{}", "n".repeat(LockName::MAX_LEN - prefix.len()));
    assert_eq!(name.len(), 255);
    let g = take(f, &lock(&a, &name)).await;
    assert_busy(&lock(&b, &name), "it is held").await;
    release(g).await;
    let too_long = format!("{name}n");
    let err = a
        .lock(&too_long, LockOptions::default())
        .expect_err("256 bytes");
    assert!(matches!(err, Error::InvalidName { .. }), "got {err:?}");
}

/// Empty names, NUL, control characters and over-long names are `InvalidName` for every
/// primitive.
pub async fn bad_names_are_rejected(f: &impl Factory) {
    let a = client(f).await;
    let long = "x".repeat(256);
    for bad in [
        "",
        "a\0b",
        "tab\t",
        "new\nline",
        "\u{1b}[31m",
        long.as_str(),
    ] {
        for e in refusals(&a, bad, LockOptions::default(), "a bad name") {
            assert!(matches!(e, Error::InvalidName { .. }), "{bad:?}: {e:?}");
        }
    }
}

/// Zero, too-short and too-long leases and zero permits are `InvalidArgument`.
pub async fn bad_options_are_rejected(f: &impl Factory) {
    let a = client(f).await;
    let c = caps(&a);
    let name = Names::new().name("opts");
    let mut leases = vec![Lease::Fixed(ZERO), Lease::watchdog(ZERO)];
    if let Some(short) = c.min_lease.checked_sub(Duration::from_nanos(1))
        && !short.is_zero()
    {
        leases.push(Lease::watchdog(short));
        leases.push(Lease::Fixed(short));
    }
    if c.max_lease < Lease::MAX {
        let long = c.max_lease + Duration::from_secs(1);
        leases.push(Lease::watchdog(long));
        leases.push(Lease::Fixed(long));
    }
    for lease in leases {
        let e = a
            .lock(&name, LockOptions::new().with_lease(lease))
            .expect_err("a zero or too-short lease");
        assert!(
            matches!(e, Error::InvalidArgument { .. }),
            "{lease:?}: {e:?}"
        );
    }
    if c.semaphore {
        let e = a
            .semaphore(&name, 0, LockOptions::default())
            .expect_err("zero permits");
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    }
}

/// A backend without read-write locks or semaphores says `Unsupported` for them, instead of
/// handing out something that does not exclude.
pub async fn missing_primitives_are_unsupported(f: &impl Factory) {
    let a = client(f).await;
    let c = caps(&a);
    if c.read_write && c.semaphore {
        return not_applicable(f, "read-write locks and semaphores are supported");
    }
    let name = Names::new().name("missing");
    let opts = LockOptions::default();
    if !c.read_write {
        let made = a.read_write_lock(&name, opts);
        assert_unsupported(made, "read_write_lock without the capability");
    }
    if !c.semaphore {
        let made = a.semaphore(&name, 2, opts);
        assert_unsupported(made, "semaphore without the capability");
    }
}

/// A drift allowance over half the lease is `InvalidArgument` (the guard would stop vouching
/// for its hold before its watchdog could renew it); none at all is accepted.
pub async fn a_drift_allowance_over_half_the_lease_is_rejected(f: &impl Factory) {
    let a = client(f).await;
    let name = Names::new().name("drift");
    let lease = LockOptions::default().lease.ttl();
    let too_much = LockOptions::new().with_drift(DriftAllowance::new(600_000, Duration::ZERO));
    let e = a
        .lock(&name, too_much)
        .expect_err("an allowance of 60 % of the lease");
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                argument: "drift",
                ..
            }
        ),
        "{e:?}"
    );
    let fixed_too_much =
        LockOptions::new().with_drift(DriftAllowance::new(0, lease / 2 + Duration::from_millis(1)));
    assert!(
        a.lock(&name, fixed_too_much).is_err(),
        "half the lease and more"
    );
    let none = LockOptions::new().with_drift(DriftAllowance::NONE);
    let l = a
        .lock(&name, none)
        .unwrap_or_else(|e| panic!("no allowance: {e}"));
    release(take(f, &l).await).await;
}
