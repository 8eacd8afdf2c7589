//! Certificates for the TLS tests, made here with rcgen: a CA, servers
//! for `localhost`/`127.0.0.1` (one of them expired), a client, and a
//! client of another CA, written as PEM files into a temporary directory.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A CA and what it signs, written as PEM files into a directory: `ca`,
/// `server` (CN server-a), `server-b`, `client` (CN team-a), `expired`, and
/// `rogue-ca` with its `rogue-client`; `NAME.pem` and `NAME.key`.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        let pki = Pki { dir: tempfile::tempdir().expect("temp dir") };
        let ca = pki.ca("ca", "sluice test CA");
        pki.leaf(&ca, "server", "server-a", &["localhost", "127.0.0.1"], None);
        pki.leaf(&ca, "server-b", "server-b", &["localhost", "127.0.0.1"], None);
        pki.leaf(&ca, "client", "team-a", &[], None);
        pki.leaf(&ca, "expired", "server-expired", &["localhost", "127.0.0.1"], Some((2020, 2021)));
        let rogue = pki.ca("rogue-ca", "someone else's CA");
        pki.leaf(&rogue, "rogue-client", "intruder", &[], None);
        pki
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    fn ca(&self, file: &str, name: &str) -> Issuer<'static, KeyPair> {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("self-signed CA");
        std::fs::write(self.path(&format!("{file}.pem")), cert.pem()).expect("write CA");
        Issuer::new(params, key)
    }

    fn leaf(&self, ca: &Issuer<'_, KeyPair>, file: &str, name: &str, names: &[&str], years: Option<(i32, i32)>) {
        let key = KeyPair::generate().expect("key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).expect("params");
        params.distinguished_name.push(DnType::CommonName, name);
        if let Some((from, to)) = years {
            params.not_before = rcgen::date_time_ymd(from, 1, 1);
            params.not_after = rcgen::date_time_ymd(to, 1, 1);
        }
        let cert = params.signed_by(&key, ca).expect("sign");
        std::fs::write(self.path(&format!("{file}.pem")), cert.pem()).expect("write cert");
        std::fs::write(self.path(&format!("{file}.key")), key.serialize_pem()).expect("write key");
    }
}
