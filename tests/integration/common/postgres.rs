//! A throw-away PostgreSQL cluster for one test: `initdb` into a temporary
//! directory, `pg_ctl start` on a private port (TCP on 127.0.0.1 only, the
//! socket in the data directory), stopped and removed on drop. Debian's
//! `postgresql` package provides the programs (scripts/setup.sh --tests
//! installs it); PostgreSQL refuses to run as root, so under root the
//! cluster belongs to the package's `postgres` user.
//!
//! Self-contained (std and tokio-postgres only): `benches/probe.rs`
//! includes this file too.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    pub port: u16,
    as_root: bool,
}

/// The directory of `initdb`: Debian keeps it under
/// /usr/lib/postgresql/<version>/bin, off the PATH.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| Some(e.ok()?.path().join("bin"))).filter(|p| p.join("initdb").exists()).collect())
        .unwrap_or_default();
    versions.sort();
    if let Some(newest) = versions.pop() {
        return newest;
    }
    let which = Command::new("sh").args(["-c", "command -v initdb"]).output().expect("sh runs");
    let path = String::from_utf8_lossy(&which.stdout).trim().to_owned();
    assert!(!path.is_empty(), "PostgreSQL is not installed: run scripts/setup.sh --tests (Debian package postgresql)");
    Path::new(&path).parent().unwrap().to_owned()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl PgCluster {
    pub fn start() -> PgCluster {
        let bin = bin_dir();
        use std::os::unix::fs::MetadataExt;
        let as_root = std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("pg-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let c = PgCluster { dir, bin, port, as_root };
        if as_root {
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&c.dir).status().unwrap();
            assert!(status.success(), "chown of the cluster directory");
        }
        let data = c.dir.join("data");
        c.run("initdb", &["-D", data.to_str().unwrap(), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]);
        let opts = format!("-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", c.port, c.dir.display());
        let log = c.dir.join("postgres.log");
        c.run("pg_ctl", &["-D", data.to_str().unwrap(), "-o", &opts, "-l", log.to_str().unwrap(), "-w", "start"]);
        c
    }

    /// Runs PostgreSQL program `program` (as `postgres` under root).
    fn run(&self, program: &str, args: &[&str]) {
        let exe = self.bin.join(program);
        let out = if self.as_root {
            Command::new("runuser").args(["-u", "postgres", "--"]).arg(&exe).args(args).output()
        } else {
            Command::new(&exe).args(args).output()
        }
        .unwrap_or_else(|e| panic!("{} cannot run: {e}", exe.display()));
        assert!(
            out.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The connection string of the cluster's `postgres` database.
    pub fn connection(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }

    /// Runs `sql` (several statements) on the cluster.
    pub fn execute(&self, sql: &str) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&self.connection(), tokio_postgres::NoTls).await.unwrap();
            let task = tokio::spawn(conn);
            client.batch_execute(sql).await.unwrap();
            drop(client);
            let _ = task.await;
        });
    }
}

impl PgCluster {
    /// The single number `sql` selects.
    #[allow(dead_code)] // by the tests; the benches that share this file do not ask
    pub fn number(&self, sql: &str) -> i64 {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&self.connection(), tokio_postgres::NoTls).await.unwrap();
            let task = tokio::spawn(conn);
            let n = client.query_one(sql, &[]).await.unwrap().get(0);
            drop(client);
            let _ = task.await;
            n
        })
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let exe = self.bin.join("pg_ctl");
        let args = ["-D", data.to_str().unwrap(), "-m", "immediate", "-w", "stop"];
        let _ = if self.as_root {
            Command::new("runuser").args(["-u", "postgres", "--"]).arg(&exe).args(args).output()
        } else {
            Command::new(&exe).args(args).output()
        };
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
