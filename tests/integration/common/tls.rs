//! TLS material for the SASL_SSL suite, made with OpenSSL: a certificate
//! authority of the test's own and a broker certificate for 127.0.0.1
//! that it signed, valid for a day.

use std::path::Path;
use std::process::Command;

/// The password of `broker.p12`.
pub const KEYSTORE_PASSWORD: &str = "reconciler-tls-secret";

/// Writes `ca.pem` (the authority a client trusts) and `broker.p12` (the
/// broker's key and certificate, PKCS12, [`KEYSTORE_PASSWORD`]) into `dir`.
pub fn make(dir: &Path) {
    std::fs::write(dir.join("ext.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    let steps: [&[&str]; 4] = [
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "1",
            "-subj",
            "/CN=reconciler-test-ca",
        ],
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "broker.key",
            "-out",
            "broker.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
        &[
            "x509",
            "-req",
            "-in",
            "broker.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "broker.pem",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
        ],
        &[
            "pkcs12",
            "-export",
            "-in",
            "broker.pem",
            "-inkey",
            "broker.key",
            "-out",
            "broker.p12",
            "-passout",
            &format!("pass:{KEYSTORE_PASSWORD}"),
        ],
    ];
    for args in steps {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
