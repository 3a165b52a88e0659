//! Where a SQLite file lives: SQLite's locks (and so dlock's exclusion) rely on the file
//! system's locking, which network file systems (NFS, SMB, sshfs …) and the folders a virtual
//! machine or container shares with its host (virtiofs, Docker Desktop's grpcfuse, VirtualBox
//! and VMware shared folders) do not always honour across the two sides, and WAL mode needs
//! shared memory that only works within one kernel. dlock warns when a SQLite file is on one
//! (Linux; elsewhere it cannot tell and says nothing).

use std::path::{Path, PathBuf};

/// File system types that are shared over a network or with a virtual machine's host, as
/// `/proc/self/mounts` names them.
const NETWORK: &[&str] = &[
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "afs",
    "ceph",
    "glusterfs",
    "lustre",
    "fuse.sshfs",
    "fuse.s3fs",
    "fuse.rclone",
    "davfs",
    "fuse.glusterfs",
    "virtiofs",
    "fuse.grpcfuse",
    "vboxsf",
    "vmhgfs",
    "fuse.vmhgfs-fuse",
    "prl_fs",
];

/// The network file system `path` is on, if it is on one (and the system says so).
pub(crate) fn network_file_system(path: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let dir = existing_ancestor(path)?;
    let fs = file_system_of(&mounts, &dir)?;
    NETWORK.contains(&fs.as_str()).then_some(fs)
}

/// Warns (through `tracing`) if the SQLite file at `path` is on a network file system.
pub(crate) fn warn_if_shared(path: &Path) {
    if let Some(fs) = network_file_system(path) {
        tracing::warn!(
            path = %path.display(),
            file_system = %fs,
            "the SQLite file is on a network file system or one shared with a virtual \
             machine's host: its locks may not exclude processes on the other side, and WAL \
             mode works within one kernel only; use a local file, or a server backend for \
             locks shared between hosts"
        );
    }
}

/// The nearest ancestor of `path` (or `path` itself) that exists, made absolute and with
/// its links resolved; the file itself may not exist yet.
fn existing_ancestor(path: &Path) -> Option<PathBuf> {
    path.ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .find_map(|p| p.canonicalize().ok())
        .or_else(|| std::env::current_dir().ok())
}

/// The type of the file system mounted nearest above `dir`, read from the text of
/// `/proc/self/mounts` (the last mount on a point wins, as it hides the ones below it).
fn file_system_of(mounts: &str, dir: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mounts.lines() {
        let mut fields = line.split(' ');
        let (Some(_device), Some(point), Some(fs)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let point = unescape(point);
        let depth = Path::new(&point).components().count();
        if dir.starts_with(&point) && best.as_ref().is_none_or(|(d, _)| depth >= *d) {
            best = Some((depth, fs.to_owned()));
        }
    }
    best.map(|(_, fs)| fs)
}

/// A mount point as the kernel writes it: space, tab, newline and backslash as octal escapes.
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
/dev/sda1 / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
server:/export /mnt/shared nfs4 rw,vers=4.2 0 0
/dev/sdb1 /mnt/shared/local ext4 rw 0 0
//nas/team /srv/team\\040files cifs rw 0 0
tmpfs /tmp tmpfs rw 0 0
myfs /run/host virtiofs rw 0 0
";

    #[test]
    fn finds_the_nearest_mount() {
        let fs = |p: &str| file_system_of(MOUNTS, Path::new(p));
        assert_eq!(fs("/home/me/locks.db").as_deref(), Some("ext4"));
        assert_eq!(fs("/mnt/shared/app/locks.db").as_deref(), Some("nfs4"));
        assert_eq!(fs("/mnt/shared/local/locks.db").as_deref(), Some("ext4"));
        assert_eq!(fs("/mnt/sharedness/locks.db").as_deref(), Some("ext4"));
        assert_eq!(fs("/srv/team files/locks.db").as_deref(), Some("cifs"));
        assert_eq!(fs("/tmp/locks.db").as_deref(), Some("tmpfs"));
        let shared = fs("/run/host/app/locks.db");
        assert_eq!(shared.as_deref(), Some("virtiofs"));
        assert!(NETWORK.contains(&shared.unwrap_or_default().as_str()));
    }

    #[test]
    fn a_local_temporary_directory_is_not_a_network_file_system() {
        let file = std::env::temp_dir()
            .join("dlock-not-there")
            .join("locks.db");
        assert_eq!(network_file_system(&file), None);
    }
}
