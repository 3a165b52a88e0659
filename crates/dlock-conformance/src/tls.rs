//! Certificates for the TLS tests of the backends: a private authority, a server certificate
//! for 127.0.0.1 and a client certificate, made with the `openssl` command (Debian: openssl,
//! installed by `scripts/services up tools`).

use std::path::{Path, PathBuf};

/// The files [`make_certificates`] writes: PEM certificates and keys.
#[derive(Debug, Clone)]
pub struct TestCertificates {
    /// The authority's certificate (`ca.pem`).
    pub ca: PathBuf,
    /// The server's certificate (`server.pem`, for IP 127.0.0.1) and key (`server.key`).
    pub server: (PathBuf, PathBuf),
    /// The client's certificate (`client.pem`) and key (`client.key`).
    pub client: (PathBuf, PathBuf),
}

/// Runs `openssl` with `args` in `dir`, failing the test with its output if it fails.
///
/// # Panics
///
/// If `openssl` cannot run or fails (it is for tests).
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (Debian: openssl; scripts/services up tools installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes, in `dir`, a certificate authority of the test's own, a certificate it signed for a
/// server on 127.0.0.1, and one for a client. Valid for two days.
///
/// # Panics
///
/// If `openssl` fails or a file cannot be written (it is for tests).
pub fn make_certificates(dir: &Path) -> TestCertificates {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=dlock test CA",
    ]);
    openssl(dir, &ca);
    for (who, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        std::fs::write(dir.join(format!("{who}.ext")), ext).expect("write the extensions");
        let (key, csr, pem, ext) = (
            format!("{who}.key"),
            format!("{who}.csr"),
            format!("{who}.pem"),
            format!("{who}.ext"),
        );
        let subject = format!("/CN=dlock test {who}");
        let mut req = vec!["req"];
        req.extend(ec);
        req.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
        openssl(dir, &req);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
    }
    TestCertificates {
        ca: dir.join("ca.pem"),
        server: (dir.join("server.pem"), dir.join("server.key")),
        client: (dir.join("client.pem"), dir.join("client.key")),
    }
}

/// A loopback port nobody listens on right now, for a server a test starts, from
/// 20000-25999, and not one this process was given before.
///
/// Not one from `bind(0)`: that comes from the range the kernel also hands to outgoing
/// connections (32768 and up by default), and on a loaded test run one of them may take the
/// port between this choice and the server's bind. The range is also below the Sentinel
/// ports `scripts/services` uses (26390 and up).
///
/// # Errors
///
/// If no port of the range can be bound (`AddrInUse`).
pub fn free_port() -> std::io::Result<u16> {
    use std::hash::{BuildHasher, RandomState};
    // Never the same port twice in one process: nothing listens on it between two calls
    // (`(free_port(), free_port())`), so the bind alone would not tell.
    static GIVEN: dlock_core::backend::Mutex<Vec<u16>> =
        dlock_core::backend::Mutex::new(Vec::new());
    let mut given = GIVEN.lock();
    let random = RandomState::new();
    let port = (0u64..6_000 * 4)
        .map(|n| 20_000 + u16::try_from(random.hash_one(n) % 6_000).unwrap_or(0))
        .find(|p| !given.contains(p) && std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                "no loopback port of 20000-25999 could be bound",
            )
        })?;
    given.push(port);
    Ok(port)
}
