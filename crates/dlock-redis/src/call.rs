//! One script call of an acquisition or a hold (the script, its keys and its arguments), and
//! what its reply means. The provider's shared state sends it (alone, or followed by `WAIT`
//! for the replicas).

use std::borrow::Cow;
use std::time::Duration;

use dlock_core::{Error, Result};
use redis::{Script, Value};

use crate::error::{other_kind, unexpected};
use crate::replicas::Ack;

/// A script with its keys and arguments, ready to send.
#[derive(Debug)]
pub(crate) struct Call<'a> {
    /// What the call does, for errors (`acquire`, `release read`).
    pub(crate) what: &'static str,
    pub(crate) script: &'static Script,
    pub(crate) keys: Vec<Cow<'a, str>>,
    pub(crate) args: Vec<Cow<'a, [u8]>>,
}

impl<'a> Call<'a> {
    /// A call of `script` without keys or arguments yet.
    pub(crate) fn new(what: &'static str, script: &'static Script) -> Self {
        Self {
            what,
            script,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// Adds the next key (`KEYS[n]`).
    pub(crate) fn key(mut self, key: impl Into<Cow<'a, str>>) -> Self {
        self.keys.push(key.into());
        self
    }

    /// Adds the next argument (`ARGV[n]`).
    pub(crate) fn arg(mut self, arg: impl Into<Cow<'a, [u8]>>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds a number as the next argument, in decimal.
    pub(crate) fn num(self, n: u64) -> Self {
        self.arg(n.to_string().into_bytes())
    }

    /// The same call, owning its keys and arguments (to send it later, in a batch).
    pub(crate) fn into_owned(self) -> Call<'static> {
        Call {
            what: self.what,
            script: self.script,
            keys: self
                .keys
                .into_iter()
                .map(|k| Cow::Owned(k.into_owned()))
                .collect(),
            args: self
                .args
                .into_iter()
                .map(|a| Cow::Owned(a.into_owned()))
                .collect(),
        }
    }
}

/// Milliseconds of `d` for a script argument: at least 1, so no duration reads as "none".
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The answer of one acquire script.
#[derive(Debug)]
pub(crate) enum Attempt {
    /// Granted with this fencing token; `ack`: what the replicas said of the grant.
    Granted { token: u64, ack: Ack },
    /// Not granted; retry after this long at the latest (`None`: only when woken).
    Busy(Option<Duration>),
    /// This acquisition already holds: the script ran before (a re-sent call) and its token
    /// is lost. Give the hold back and try again.
    Repeated,
}

/// Reads the `{-6, type}` reply of a script that found another kind's key at the name: the
/// error to return, or `None` for any other reply. `lock` says whether the request was for a
/// lock (else a permit).
pub(crate) fn read_other_kind(reply: &Value, name: &str, lock: bool) -> Option<Error> {
    match reply {
        Value::Array(items) if items.len() == 2 && items[0] == Value::Int(-6) => {
            let key_type = text(&items[1]).unwrap_or_else(|| "key of another type".into());
            Some(other_kind(name, &key_type, lock))
        }
        _ => None,
    }
}

/// Whether an acquire script's reply is a grant (`{-1, token}`): the one reply that wrote
/// something the replicas must have.
pub(crate) fn is_grant(reply: &Value) -> bool {
    matches!(reply, Value::Array(items) if matches!(items.as_slice(), [Value::Int(-1), Value::Int(t)] if *t >= 0))
}

/// Reads an acquire script's `{-1, token}` / `{pttl, -1}` reply; `ack` is what the replicas
/// said of it.
pub(crate) fn read_attempt(reply: Value, ack: Ack) -> Result<Attempt> {
    let pair = match &reply {
        Value::Array(items) if items.len() == 2 => (&items[0], &items[1]),
        _ => return Err(unexpected("acquire", &reply)),
    };
    match pair {
        (Value::Int(-1), Value::Int(token)) if *token >= 0 => u64::try_from(*token)
            .map(|token| Attempt::Granted { token, ack })
            .map_err(|_| unexpected("acquire token", &reply)),
        // -2: the key vanished between the checks: try again at once.
        (Value::Int(-2), _) => Ok(Attempt::Busy(Some(Duration::ZERO))),
        // -3: a semaphore in use with another number of permits.
        (Value::Int(-3), Value::Int(size)) => Err(Error::invalid_argument(
            "permits",
            format!(
                "the semaphore is in use with {size} permits; this handle counts a different \
                 number (handles must agree while any permit is held)"
            ),
        )),
        (Value::Int(pttl), _) if *pttl >= 0 => Ok(Attempt::Busy(Some(Duration::from_millis(
            u64::try_from(*pttl).unwrap_or(0),
        )))),
        (Value::Int(-5), _) => Ok(Attempt::Repeated),
        // -1: a holder without expiry (a foreign client's key); -4: no permit free and none
        // expiring (held without expiry). Only a message can help: wake on messages only.
        (Value::Int(-4 | -1), _) => Ok(Attempt::Busy(None)),
        _ => Err(unexpected("acquire", &reply)),
    }
}

/// Reads a release script's reply: `Ok(false)` when the hold was not ours (any more).
pub(crate) fn read_released(reply: Value) -> Result<bool> {
    match reply {
        Value::Nil => Ok(false),
        Value::Int(_) => Ok(true),
        other => Err(unexpected("release", other)),
    }
}

/// Reads the `1` / `0` reply of a renewal or a check: whether the hold is ours.
pub(crate) fn read_held(what: &str, reply: Value) -> Result<bool> {
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(unexpected(what, other)),
    }
}

/// The text of a reply item (a key type, a field, a message).
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) | Value::VerbatimString { text: s, .. } => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}
