//! nginx in the foreground with a site the test writes; killed when dropped.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

use super::files::TempDir;
use super::process::require_program;

/// How long nginx gets to start listening: it starts in milliseconds, but a loaded two-core
/// machine must not fail a test that would pass. (nginx itself retries a busy port for 2.5 s.)
const NGINX_START: Duration = Duration::from_secs(20);

/// A running nginx.
pub struct Nginx {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    dir: TempDir,
    /// A master process with a worker, so that [`Nginx::reload`] works (nginx's single-process
    /// mode does not reload cleanly).
    master: bool,
}

/// Why an nginx did not come up.
enum StartError {
    /// Another process took the free port between the test finding it and nginx binding it.
    PortTaken(String),
    /// Anything else: the log says what.
    Failed(String),
}

impl Nginx {
    /// Starts nginx on a free port with the site `site(listen)` returns (a `server` block and
    /// whatever it needs, included in an `http` block).
    pub async fn start(site: impl Fn(SocketAddr) -> String) -> Nginx {
        Nginx::start_in_mode(site, false).await
    }

    /// [`Nginx::start`] with a master process, whose site [`Nginx::reload`] can change.
    pub async fn start_reloadable(site: impl Fn(SocketAddr) -> String) -> Nginx {
        Nginx::start_in_mode(site, true).await
    }

    async fn start_in_mode(site: impl Fn(SocketAddr) -> String, master: bool) -> Nginx {
        let nginx = require_program("nginx", "apt-get update && apt-get install -y nginx");
        // The port is free when chosen, not reserved: if something takes it before nginx binds
        // it, choose another.
        let mut last = String::new();
        for _ in 0..3 {
            match Nginx::try_start(&nginx, &site, master).await {
                Ok(running) => return running,
                Err(StartError::PortTaken(log)) => last = log,
                Err(StartError::Failed(log)) => panic!("nginx did not start:\n{log}"),
            }
        }
        panic!("nginx found its port taken three times:\n{last}")
    }

    async fn try_start(
        nginx: &Path,
        site: &impl Fn(SocketAddr) -> String,
        master: bool,
    ) -> Result<Nginx, StartError> {
        let dir = TempDir::new("nginx");
        let listen = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("find a free port");
        let site_path = dir.write("site.conf", &site(listen));
        let tmp = dir.path().display().to_string();
        let wrapper = format!(
            "# Written by tests/it/support/nginx.rs: what a host's nginx.conf provides.\n\
             daemon off;\n\
             master_process {};\n\
             worker_processes 1;\n\
             pid {tmp}/nginx.pid;\n\
             error_log {tmp}/error.log info;\n\
             events {{ worker_connections 256; }}\n\
             http {{\n\
             \x20   access_log {tmp}/access.log;\n\
             \x20   client_body_temp_path {tmp}/client_body;\n\
             \x20   proxy_temp_path {tmp}/proxy;\n\
             \x20   fastcgi_temp_path {tmp}/fastcgi;\n\
             \x20   uwsgi_temp_path {tmp}/uwsgi;\n\
             \x20   scgi_temp_path {tmp}/scgi;\n\
             \x20   # A host's main configuration may compress everything (Debian's turns gzip on);\n\
             \x20   # the site must keep streams uncompressed by itself.\n\
             \x20   gzip on;\n\
             \x20   gzip_min_length 1;\n\
             \x20   gzip_types text/event-stream application/json application/x-ndjson;\n\
             \x20   include {site};\n\
             }}\n",
            if master { "on" } else { "off" },
            site = site_path.display(),
        );
        let conf = dir.write("nginx.conf", &wrapper);
        let output = std::fs::File::create(dir.path().join("nginx.out")).expect("nginx.out");
        let child = Command::new(nginx)
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(output.try_clone().expect("nginx.out"))
            .stderr(output)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", nginx.display()));
        let mut running = Nginx {
            child,
            addr: listen,
            dir,
            master,
        };
        running.ready().await?;
        Ok(running)
    }

    /// Waits until nginx accepts connections. nginx announces nothing the test could await, so
    /// this polls a TCP connect, with a deadline, and stops early if nginx exits.
    async fn ready(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + NGINX_START;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll nginx") {
                let log = format!("nginx exited with {status}\n{}", self.log());
                return Err(if log.contains("Address already in use") {
                    StartError::PortTaken(log)
                } else {
                    StartError::Failed(log)
                });
            }
            if TcpStream::connect(self.addr).await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(StartError::Failed(format!(
                    "nginx did not listen on {} within {NGINX_START:?}\n{}",
                    self.addr,
                    self.log()
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Replaces the site with `site(listen)` and waits until new requests get it: the old
    /// worker finishes what it has in hand and accepts nothing more (what a Service's endpoints
    /// update does in Kubernetes). Needs [`Nginx::start_reloadable`].
    pub async fn reload(&self, site: impl Fn(SocketAddr) -> String) {
        assert!(self.master, "start_reloadable");
        let done = |log: &str| log.matches("gracefully shutting down").count();
        let before = done(&self.error_log());
        self.dir.write("site.conf", &site(self.addr));
        super::process::signal(self.child.id(), "HUP");
        let deadline = Instant::now() + NGINX_START;
        while done(&self.error_log()) == before {
            assert!(
                Instant::now() < deadline,
                "nginx did not reload:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// `http://<nginx>` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// nginx's output, error and access logs, for failure messages.
    pub fn log(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir.path().join(name));
        format!(
            "--- nginx output ---\n{}\n--- error.log ---\n{}\n--- access.log ---\n{}",
            read("nginx.out").unwrap_or_default(),
            read("error.log").unwrap_or_default(),
            read("access.log").unwrap_or_default()
        )
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        if self.master {
            // SIGTERM: the master stops its workers, then exits (bounded: then killed).
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // One process (`master_process off`), so killing it leaves nothing behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
