//! A private PostgreSQL server for tests that stop and restart the database (the shared one on
//! port 5432 serves other tests, which must not see it go away): `initdb` into a temporary
//! directory, `pg_ctl` on a random loopback port, stopped and removed when dropped, pass or
//! fail. Uses the binaries of the installed PostgreSQL (`/usr/lib/postgresql/*/bin`); as root
//! it runs them as the `postgres` user (PostgreSQL refuses to run as root).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A running private PostgreSQL server.
pub struct PrivatePostgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_postgres_user: bool,
}

/// The newest installed PostgreSQL's binary directory.
fn bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").is_file() && p.join("pg_ctl").is_file())
        .collect();
    dirs.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("local addr: {e}"))
}

fn describe(what: &str, output: std::io::Result<Output>) -> Result<String, String> {
    match output {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err(format!(
            "{what} failed ({}): {}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!("cannot run {what}: {e}")),
    }
}

impl PrivatePostgres {
    /// Creates and starts a server; `Err` says why it is not possible here (no PostgreSQL
    /// installed, no `postgres` user, ...), for the test to skip or, under `CI=true`, fail.
    pub fn start() -> Result<Self, String> {
        let bin = bin_dir().ok_or("no PostgreSQL under /usr/lib/postgresql/*/bin")?;
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let as_postgres_user = running_as_root();
        let server = Self {
            dir,
            bin,
            port: free_port()?,
            as_postgres_user,
        };
        if as_postgres_user {
            describe(
                "chown",
                Command::new("chown")
                    .args(["-R", "postgres:"])
                    .arg(server.dir.path())
                    .output(),
            )?;
        }
        describe(
            "initdb",
            server
                .command("initdb")
                .args([
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "-D",
                ])
                .arg(server.data())
                .output(),
        )?;
        server.start_again()?;
        Ok(server)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        if self.as_postgres_user {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        }
    }

    /// `postgres://` URL of the server's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts the (stopped) server again on the same port and data; waits until it accepts.
    pub fn start_again(&self) -> Result<(), String> {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {}",
            self.port,
            self.dir.path().display()
        );
        describe(
            "pg_ctl start",
            self.command("pg_ctl")
                .args(["-w", "-t", "60", "-l"])
                .arg(self.dir.path().join("log"))
                .arg("-D")
                .arg(self.data())
                .args(["-o", &options, "start"])
                .output(),
        )
        .map(|_| ())
    }

    /// Stops the server (fast shutdown: connections are cut, committed data is kept).
    pub fn stop(&self) -> Result<(), String> {
        describe(
            "pg_ctl stop",
            self.command("pg_ctl")
                .args(["-w", "-m", "fast", "-D"])
                .arg(self.data())
                .arg("stop")
                .output(),
        )
        .map(|_| ())
    }

    /// True while the server accepts connections.
    pub fn is_accepting(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-t", "2"])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// Runs `sql` with `psql` and returns its unaligned output.
    pub fn psql(&self, sql: &str) -> Result<String, String> {
        describe(
            "psql",
            Command::new(self.bin.join("psql"))
                .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d"])
                .arg(self.url())
                .args(["-c", sql])
                .output(),
        )
    }

    /// The data directory's parent (log file `log` lives there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .command("pg_ctl")
            .args(["-w", "-m", "immediate", "-D"])
            .arg(self.data())
            .arg("stop")
            .output();
    }
}
