//! Znode naming: lock names to paths, Curator's protected node names, and the sort orders
//! of the recipes.

use std::fmt::Write as _;

use dlock_core::LockName;

/// Curator's `LockInternals` node prefix of a mutex (`InterProcessMutex`).
pub(crate) const LOCK: &str = "lock-";
/// The marker of an election's node (Curator's `LeaderLatch`).
pub(crate) const LATCH: &str = "latch-";
/// Curator's read node prefix (`InterProcessReadWriteLock`).
pub(crate) const READ: &str = "__READ__";
/// Curator's write node prefix (`InterProcessReadWriteLock`).
pub(crate) const WRITE: &str = "__WRIT__";
/// Curator's lease node prefix (`InterProcessSemaphoreV2`).
pub(crate) const LEASE: &str = "lease-";
/// Every marker of a contender node: a name segment that parses with one is escaped.
const MARKERS: [&str; 5] = [LOCK, READ, WRITE, LEASE, LATCH];
/// The semaphore's internal mutex, under the semaphore's path.
pub(crate) const LOCKS: &str = "locks";
/// The semaphore's lease nodes' parent, under the semaphore's path.
pub(crate) const LEASES: &str = "leases";

/// Characters ZooKeeper refuses in a path (Java's `PathUtils.validatePath`). Anything outside
/// the Basic Multilingual Plane is a surrogate pair in Java, which ZooKeeper refuses too.
pub(crate) fn forbidden_char(c: char) -> bool {
    let u = u32::from(c);
    u == 0
        || (0x01..=0x1f).contains(&u)
        || (0x7f..=0x9f).contains(&u)
        || (0xd800..=0xf8ff).contains(&u)
        || u >= 0xfff0
}

/// Appends one name segment to `out`, escaped so that ZooKeeper accepts it and decoding gives
/// the segment back (which makes the whole mapping injective):
///
/// - `%` and every character ZooKeeper refuses become `%XX` per UTF-8 byte;
/// - an empty segment becomes a lone `%` (no other segment encodes to that);
/// - `.` and `..` become `%2E` and `%2E%2E`;
/// - a first segment `zookeeper` at the root becomes `%7Aookeeper` (the server reserves
///   `/zookeeper`);
/// - a segment below another node (any but the first at the root: under a chroot the first
///   is below the chroot's own node, which a provider without the chroot can lock) that a
///   recipe of the lock above it would read as its own (`locks` and
///   `leases`, a semaphore's directories, and names like `lock-0000000001` or
///   `latch-0000000001` that parse as contender nodes) gets one character escaped, so that no name shares a path with another
///   lock's internals: `x/locks` lives at `x/%6Cocks`, and `x/lock-0000000001` at
///   `x/lock-%30000000001`.
fn push_segment(out: &mut String, segment: &str, reserved_root: bool, nested: bool) {
    if segment.is_empty() {
        out.push('%');
        return;
    }
    if segment == "." || segment == ".." {
        out.push_str(&"%2E".repeat(segment.len()));
        return;
    }
    // The index of one character to escape so that the segment is not read as recipe internals.
    let internal = if nested && (segment == LOCKS || segment == LEASES) {
        Some(0)
    } else if nested && is_recipe_node(segment) {
        // The first character of the sequence, after the last marker that parses.
        MARKERS
            .iter()
            .filter(|m| sequence(segment, m).is_some())
            .filter_map(|m| segment.rfind(m).map(|at| at + m.len()))
            .max()
            .map(|byte| segment[..byte].chars().count())
    } else {
        None
    };
    for (i, c) in segment.chars().enumerate() {
        let escape =
            c == '%' || forbidden_char(c) || (reserved_root && i == 0) || internal == Some(i);
        if escape {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
}

/// The znode path of lock `name` under `base` (`""` for the root, else `/a/b`).
///
/// `/` in a name separates path segments, so `orders/42` lives at `{base}/orders/42` and a
/// Curator peer uses that path as is. Segments ZooKeeper cannot represent are escaped (see
/// [`push_segment`]); a name without `%`, empty, `.` or `..` segments and characters
/// ZooKeeper refuses maps to `{base}/{name}` unchanged.
pub(crate) fn lock_path(base: &str, name: &LockName) -> String {
    let mut out = String::with_capacity(base.len() + name.as_str().len() + 8);
    out.push_str(base);
    for (i, segment) in name.as_str().split('/').enumerate() {
        out.push('/');
        let reserved_root = i == 0 && base.is_empty() && segment == "zookeeper";
        push_segment(&mut out, segment, reserved_root, i > 0 || !base.is_empty());
    }
    out
}

/// The parent of `path` (`None` for a top-level node).
pub(crate) fn parent(path: &str) -> Option<&str> {
    match path.rfind('/') {
        Some(0) | None => None,
        Some(i) => Some(&path[..i]),
    }
}

/// Curator's protection prefix: `_c_` + a fresh lowercase UUID + `-`.
pub(crate) fn protected_prefix() -> String {
    format!("_c_{}-", uuid::Uuid::new_v4())
}

/// The sequence of a node of the given kind: the text after the last `marker`, ZooKeeper's
/// `%010d` of the parent's counter (10 or more characters: digits, or a `-` and digits once the
/// counter has overflowed); `None` if `node` is not such a node (e.g. the container of a nested
/// lock name). Negative sequences are contenders too, sorted as text as Curator sorts them.
pub(crate) fn sequence<'a>(node: &'a str, marker: &str) -> Option<&'a str> {
    let at = node.rfind(marker)?;
    let text = &node[at + marker.len()..];
    let digits = text.strip_prefix('-').unwrap_or(text);
    (text.len() >= 10 && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then_some(text)
}

/// A contender node of a recipe, with its sort key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Contender {
    /// The sequence text (compared as text, as Curator does).
    pub(crate) seq: String,
    /// The node name (ties: a downgraded reader shares its writer's sequence).
    pub(crate) node: String,
    /// Whether the node excludes readers: a write node or a mutex node.
    pub(crate) writer: bool,
}

/// The contenders among `children` whose name has one of `markers` followed by a sequence,
/// sorted the way Curator sorts them (by the text after the marker).
pub(crate) fn contenders(children: Vec<String>, markers: &[&str]) -> Vec<Contender> {
    let mut out: Vec<Contender> = children
        .into_iter()
        .filter_map(|node| {
            markers.iter().find_map(|m| {
                sequence(&node, m).map(|seq| Contender {
                    seq: seq.to_owned(),
                    writer: *m == WRITE || *m == LOCK,
                    node: node.clone(),
                })
            })
        })
        .collect();
    out.sort();
    out
}

/// Where a contender stands.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// It holds the lock.
    Granted,
    /// It waits; watch this node.
    Watch(String),
    /// Its node is not there (any more).
    Missing,
}

/// A mutex or writer: holds when first, else watches its predecessor.
pub(crate) fn exclusive_standing(sorted: &[Contender], ours: &str) -> Standing {
    match sorted.iter().position(|c| c.node == ours) {
        None => Standing::Missing,
        Some(0) => Standing::Granted,
        Some(i) => Standing::Watch(sorted[i - 1].node.clone()),
    }
}

/// A reader: holds when no writer (or mutex) comes before it, else watches the first one
/// before it.
pub(crate) fn reader_standing(sorted: &[Contender], ours: &str) -> Standing {
    let mut first_writer = None;
    for c in sorted {
        if c.node == ours {
            return match first_writer {
                None => Standing::Granted,
                Some(w) => Standing::Watch(w),
            };
        }
        if c.writer && first_writer.is_none() {
            first_writer = Some(c.node.clone());
        }
    }
    Standing::Missing
}

/// Whether the child name `node` is a contender node dlock (or Curator) creates for a lock
/// or an election: a mutex, read, write, lease or latch node (`...lock-`, `...__READ__`,
/// `...__WRIT__`, `...lease-` or `...latch-` followed by the sequence). Parents such as
/// `locks` and `leases`, and the containers of nested lock names, are not.
pub fn is_recipe_node(node: &str) -> bool {
    MARKERS.iter().any(|m| sequence(node, m).is_some())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn path(name: &str) -> String {
        path_under("", name)
    }

    fn path_under(chroot: &str, name: &str) -> String {
        lock_path(chroot, &LockName::new(name).unwrap())
    }

    #[test]
    fn plain_names_keep_their_slashes() {
        assert_eq!(path("orders/42"), "/orders/42");
        assert_eq!(path("a b:c{d}'\"\\*?"), "/a b:c{d}'\"\\*?");
        assert_eq!(path("é"), "/é");
        assert_eq!(path_under("/base", "x/y"), "/base/x/y");
    }

    #[test]
    fn unrepresentable_segments_are_escaped() {
        assert_eq!(path("a/"), "/a/%");
        assert_eq!(path("/a"), "/%/a");
        assert_eq!(path("a//b"), "/a/%/b");
        assert_eq!(path("a/./b"), "/a/%2E/b");
        assert_eq!(path("a/../b"), "/a/%2E%2E/b");
        assert_eq!(path("100%"), "/100%25");
        assert_eq!(path("🔒"), "/%F0%9F%94%92");
        assert_eq!(path("\u{e000}"), "/%EE%80%80");
        assert_eq!(path("zookeeper/x"), "/%7Aookeeper/x");
        assert_eq!(path_under("/base", "zookeeper"), "/base/zookeeper");
        assert_eq!(path("x/zookeeper"), "/x/zookeeper");
    }

    /// No name's path is another lock's internals.
    #[test]
    fn names_never_land_in_recipe_internals() {
        assert_eq!(path("x/locks"), "/x/%6Cocks");
        assert_eq!(path("x/leases"), "/x/%6Ceases");
        assert_eq!(path("x/lock-0000000001"), "/x/lock-%30000000001");
        assert_eq!(
            path("s/leases/lease-0000000001"),
            "/s/%6Ceases/lease-%30000000001"
        );
        assert_eq!(path("x/locksmith"), "/x/locksmith");
        assert_eq!(path("locks"), "/locks");
        // Under a chroot the first segment is below a node too: `zk://h/x` with lock `locks`
        // is not semaphore `x`'s internal mutex for `zk://h`, nor is `zk://h/a` with lock
        // `lock-0000000001` a contender of lock `a`.
        let chrooted = |base: &str, name: &str| lock_path(base, &LockName::new(name).unwrap());
        assert_eq!(chrooted("/x", "locks"), "/x/%6Cocks");
        assert_eq!(chrooted("/x", "leases"), "/x/%6Ceases");
        assert_eq!(chrooted("/a", "lock-0000000001"), "/a/lock-%30000000001");
        for n in [
            "x/lock-0000000001",
            "x/_c_0-__WRIT__0000000002",
            "x/lease--000000005",
        ] {
            let p = path(n);
            let last = p.rsplit('/').next().unwrap();
            assert!(!is_recipe_node(last), "{n:?} -> {p:?}");
        }
    }

    /// Maps `name`, and checks that no name in `seen` had its path and that the path is one
    /// ZooKeeper accepts.
    fn map_once(seen: &mut HashMap<String, String>, name: &str) {
        let p = path(name);
        if let Some(prev) = seen.insert(p.clone(), name.to_owned()) {
            panic!("{prev:?} and {name:?} both map to {p:?}");
        }
        for seg in p[1..].split('/') {
            assert!(
                !seg.is_empty() && seg != "." && seg != "..",
                "{name:?} -> {p:?}"
            );
            assert!(!seg.chars().any(forbidden_char), "{name:?} -> {p:?}");
        }
    }

    #[test]
    fn mapping_is_injective() {
        let names = [
            "a",
            "a/",
            "a//",
            "/a",
            "a/%",
            "a/%25",
            "a%",
            "a%25",
            "a/.",
            "a/%2E",
            "a/..",
            "a/%2E%2E",
            "a/./b",
            "a/../b",
            "a//b",
            "a/%/b",
            "🔒",
            "%F0%9F%94%92",
            "zookeeper",
            "%7Aookeeper",
            "x/y",
            "x/y/",
            "x",
            "%",
            "%%",
            "/",
            "//",
            "x/locks",
            "x/%6Cocks",
            "x/leases",
            "x/lock-0000000001",
            "x/lock-%30000000001",
            "x/_c_0-__READ__0000000002",
            "x/lease-0000000003",
            "locks",
            "lock-0000000001",
        ];
        let mut seen = HashMap::new();
        for n in names {
            map_once(&mut seen, n);
        }
    }

    /// Every name over an alphabet of the characters the mapping treats specially
    /// (separators, escapes, dots, recipe words), up to five characters: no two share a path,
    /// and every path is one ZooKeeper accepts.
    #[test]
    fn mapping_is_injective_exhaustively() {
        let alphabet = ['a', '/', '%', '.', '2', 'E', 'l', '-', '0'];
        let mut names = vec![String::new()];
        let mut seen = HashMap::new();
        for _ in 0..5 {
            let mut longer = Vec::new();
            for n in &names {
                for c in alphabet {
                    let name = format!("{n}{c}");
                    map_once(&mut seen, &name);
                    longer.push(name);
                }
            }
            names = longer;
        }
        assert_eq!(seen.len(), (1..=5).map(|k| 9usize.pow(k)).sum::<usize>());
    }

    #[test]
    fn protected_prefix_is_curators() {
        let p = protected_prefix();
        assert_eq!(p.len(), 3 + 36 + 1);
        assert!(p.starts_with("_c_") && p.ends_with('-'));
        assert_eq!(p, p.to_lowercase());
        assert_ne!(p, protected_prefix());
    }

    /// Waiting, watching `node`.
    fn watch(node: &str) -> Standing {
        Standing::Watch(node.into())
    }

    /// Each `(node, standing)`: `judge` (a reader's rule, or a mutex's and writer's) finds
    /// `node` of `sorted` in `standing`.
    fn assert_standings(
        sorted: &[Contender],
        judge: fn(&[Contender], &str) -> Standing,
        expected: &[(&str, Standing)],
    ) {
        for (node, standing) in expected {
            assert_eq!(&judge(sorted, node), standing, "{node}");
        }
    }

    #[test]
    fn sequences_and_sorting() {
        assert_eq!(sequence("_c_x-lock-0000000007", LOCK), Some("0000000007"));
        assert_eq!(sequence("lock-0000000007", LOCK), Some("0000000007"));
        assert_eq!(sequence("lock-", LOCK), None);
        assert_eq!(sequence("y", LOCK), None);
        assert_eq!(sequence("lock-12", LOCK), None);
        assert_eq!(sequence("lock-2147483648", LOCK), Some("2147483648"));
        assert_eq!(sequence("lock--2147483648", LOCK), Some("-2147483648"));
        assert_eq!(sequence("lock--000000005", LOCK), Some("-000000005"));
        assert_eq!(sequence("lock--", LOCK), None);
        assert_eq!(sequence("lock--12", LOCK), None);
        // After the counter overflowed, Curator sorts `-...` before `0...`: so does dlock.
        let wrapped = contenders(
            vec!["lock-2147483647".to_owned(), "lock--2147483648".to_owned()],
            &[LOCK],
        );
        assert_eq!(wrapped[0].node, "lock--2147483648");
        let children = vec![
            "_c_b-lock-0000000003".to_owned(),
            "nested".to_owned(),
            "_c_a-lock-0000000010".to_owned(),
            "lock-0000000001".to_owned(),
        ];
        let sorted = contenders(children, &[LOCK]);
        let order: Vec<_> = sorted.iter().map(|c| c.node.as_str()).collect();
        assert_eq!(
            order,
            [
                "lock-0000000001",
                "_c_b-lock-0000000003",
                "_c_a-lock-0000000010"
            ]
        );
        let expected = [
            ("lock-0000000001", Standing::Granted),
            ("_c_a-lock-0000000010", watch("_c_b-lock-0000000003")),
            ("gone", Standing::Missing),
        ];
        assert_standings(&sorted, exclusive_standing, &expected);
    }

    #[test]
    fn read_write_standing() {
        let children = vec![
            "_c_1-__READ__0000000001".to_owned(),
            "_c_2-__WRIT__0000000002".to_owned(),
            "_c_3-__READ__0000000003".to_owned(),
            "_c_4-__WRIT__0000000004".to_owned(),
            "_c_5-__READ__0000000002".to_owned(), // a downgraded reader at its writer's place
        ];
        let sorted = contenders(children, &[READ, WRITE]);
        let readers = [
            ("_c_1-__READ__0000000001", Standing::Granted),
            ("_c_3-__READ__0000000003", watch("_c_2-__WRIT__0000000002")),
        ];
        assert_standings(&sorted, reader_standing, &readers);
        let writers = [
            ("_c_2-__WRIT__0000000002", watch("_c_1-__READ__0000000001")),
            ("_c_4-__WRIT__0000000004", watch("_c_3-__READ__0000000003")),
        ];
        assert_standings(&sorted, exclusive_standing, &writers);
        // After the writer left, the downgraded reader still blocks later writers.
        let sorted = contenders(
            vec![
                "_c_5-__READ__0000000002".to_owned(),
                "_c_6-__WRIT__0000000006".to_owned(),
            ],
            &[READ, WRITE],
        );
        let writer = [("_c_6-__WRIT__0000000006", watch("_c_5-__READ__0000000002"))];
        assert_standings(&sorted, exclusive_standing, &writer);
        assert_standings(&sorted, reader_standing, &[("x", Standing::Missing)]);
    }

    #[test]
    fn recipe_nodes() {
        assert!(is_recipe_node("_c_x-lease-0000000001"));
        assert!(is_recipe_node("_c_x-__WRIT__0000000001"));
        assert!(!is_recipe_node("locks"));
        assert!(!is_recipe_node("leases"));
        assert!(!is_recipe_node("lock-"));
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(parent("/a"), None);
    }
}
