//! Redisson's key layout: the lock's own key (the name) and the keys and channels derived from
//! it, which Java clients of the same name use too.

/// Redisson's `prefixName`: `prefix:{name}`, or `prefix:name` when the name has a `{` already
/// (its own hash tag then decides the cluster slot).
pub(crate) fn prefix_name(prefix: &str, name: &str) -> String {
    if name.contains('{') {
        format!("{prefix}:{name}")
    } else {
        format!("{prefix}:{{{name}}}")
    }
}

/// Redisson's `suffixName`: `{name}:suffix`, or `name:suffix` when the name has a `{`.
pub(crate) fn suffix_name(name: &str, suffix: &str) -> String {
    if name.contains('{') {
        format!("{name}:{suffix}")
    } else {
        format!("{{{name}}}:{suffix}")
    }
}

/// What a key name is in Redisson's layout when it is not a lock's own key: a fencing token,
/// a fair queue or its timeouts, a semaphore's permits, or a read hold's timeout key of some
/// other name. A lock of that name would share the key with the other name's
/// bookkeeping, and both would fail (WRONGTYPE) or worse.
pub(crate) fn bookkeeping_key(name: &str) -> Option<&'static str> {
    const PREFIXES: [(&str, &str); 5] = [
        ("redisson_lock_token:", "another lock's fencing token"),
        ("dlock_election:", "an election's proposal"),
        ("redisson_unlock_latch:", "another lock's unlock latch"),
        ("redisson_lock_queue:", "another lock's fair queue"),
        (
            "redisson_lock_timeout:",
            "another lock's fair queue timeouts",
        ),
    ];
    if let Some((_, whose)) = PREFIXES.iter().find(|(p, _)| name.starts_with(p)) {
        return Some(whose);
    }
    if name.contains(":rwlock_timeout") {
        return Some("a read hold's timeout of another read-write lock");
    }
    if name.contains('{') {
        if name.ends_with(":timeout") {
            return Some("another semaphore's permits");
        }
        if name.ends_with(":permits") {
            return Some("another semaphore's permit count");
        }
    }
    None
}

/// The hash tag Redis Cluster hashes a key by: the text between the first `{` and the next
/// `}`, if non-empty; `None` when the whole key is hashed.
pub(crate) fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')? + open + 1;
    (close > open + 1).then(|| &key[open + 1..close])
}

/// All keys of one lock (the hash, and the Redisson keys derived from it).
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) name: String,
    pub(crate) channel: String,
    pub(crate) token: String,
    pub(crate) queue: String,
    pub(crate) timeouts: String,
    pub(crate) rw_channel: String,
    pub(crate) rw_prefix: String,
    pub(crate) sem_channel: String,
    pub(crate) sem_timeouts: String,
    pub(crate) sem_size: String,
}

impl Keys {
    pub(crate) fn new(name: &str) -> Self {
        let rw_prefix = if name.contains('{') {
            name.to_owned()
        } else {
            format!("{{{name}}}")
        };
        Self {
            name: name.to_owned(),
            channel: prefix_name("redisson_lock__channel", name),
            token: prefix_name("redisson_lock_token", name),
            queue: prefix_name("redisson_lock_queue", name),
            timeouts: prefix_name("redisson_lock_timeout", name),
            rw_channel: prefix_name("redisson_rwlock", name),
            rw_prefix,
            sem_channel: prefix_name("redisson_sc", name),
            sem_timeouts: suffix_name(name, "timeout"),
            sem_size: suffix_name(name, "permits"),
        }
    }

    /// The latch of the release of the hold with `field` (see
    /// [`latched`](crate::scripts::latched)): Redisson's `redisson_unlock_latch:{name}:<id>`.
    pub(crate) fn unlock_latch(&self, field: &str) -> String {
        format!(
            "{}:{field}",
            prefix_name("redisson_unlock_latch", &self.name)
        )
    }

    /// The fair lock's per-waiter channel.
    pub(crate) fn waiter_channel(&self, field: &str) -> String {
        format!("{}:{field}", self.channel)
    }

    /// The base of a reader's per-hold timeout keys: `{name}:<field>:rwlock_timeout`.
    pub(crate) fn read_timeouts(&self, field: &str) -> String {
        format!("{}:{field}:rwlock_timeout", self.rw_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_redisson() {
        let k = Keys::new("orders/42");
        assert_eq!(k.name, "orders/42");
        assert_eq!(k.channel, "redisson_lock__channel:{orders/42}");
        assert_eq!(k.token, "redisson_lock_token:{orders/42}");
        assert_eq!(k.queue, "redisson_lock_queue:{orders/42}");
        assert_eq!(k.timeouts, "redisson_lock_timeout:{orders/42}");
        assert_eq!(k.rw_channel, "redisson_rwlock:{orders/42}");
        assert_eq!(k.rw_prefix, "{orders/42}");
        assert_eq!(k.sem_channel, "redisson_sc:{orders/42}");
        assert_eq!(k.sem_timeouts, "{orders/42}:timeout");
        assert_eq!(k.sem_size, "{orders/42}:permits");
        assert_eq!(
            k.waiter_channel("u:1"),
            "redisson_lock__channel:{orders/42}:u:1"
        );
        assert_eq!(k.read_timeouts("u:1"), "{orders/42}:u:1:rwlock_timeout");

        let k = Keys::new("a{x}b");
        assert_eq!(k.channel, "redisson_lock__channel:a{x}b");
        assert_eq!(k.sem_timeouts, "a{x}b:timeout");
        assert_eq!(k.rw_prefix, "a{x}b");
        assert_eq!(k.read_timeouts("u:1"), "a{x}b:u:1:rwlock_timeout");
    }

    #[test]
    fn hash_tags() {
        assert_eq!(hash_tag("{orders/42}:x"), Some("orders/42"));
        assert_eq!(hash_tag("a{x}b"), Some("x"));
        assert_eq!(hash_tag("a{}b"), None);
        assert_eq!(hash_tag("a{b"), None);
        assert_eq!(hash_tag("plain"), None);
    }
}
