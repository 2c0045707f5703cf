//! Runs holdfast in process on 127.0.0.1:0 with a test configuration.

use std::net::SocketAddr;

use holdfast::config::{Config, RawConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running holdfast.
pub struct Holdfast {
    /// Proxy address.
    pub addr: SocketAddr,
    /// Admin address.
    pub admin: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

/// A raw configuration pointing at `upstream`, with every listener on port 0.
pub fn raw_config(upstream: &str) -> RawConfig {
    RawConfig {
        upstream: upstream.to_string(),
        listen: "127.0.0.1:0".into(),
        admin: "127.0.0.1:0".into(),
        ..RawConfig::default()
    }
}

impl Holdfast {
    /// Starts holdfast with default settings in front of `upstream`.
    pub async fn start(upstream: &str) -> Holdfast {
        Holdfast::start_with(raw_config(upstream)).await
    }

    /// Starts holdfast with `raw` (its listen addresses are replaced by port 0).
    pub async fn start_with(mut raw: RawConfig) -> Holdfast {
        raw.listen = "127.0.0.1:0".into();
        raw.admin = "127.0.0.1:0".into();
        let config = Config::from_raw(&raw, &|_| "test".into()).expect("valid test config");
        let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
        let admin_listener = tokio::net::TcpListener::bind(config.admin).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let admin = admin_listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(holdfast::server::run(
            config,
            listener,
            admin_listener,
            async move {
                let _ = stopped.await;
            },
        ));
        Holdfast {
            addr,
            admin,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// `http://addr` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Starts shutting down (as SIGTERM does) without waiting.
    pub fn begin_shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Shuts down and waits until holdfast has stopped.
    pub async fn shutdown(mut self) {
        self.begin_shutdown();
        self.wait().await;
    }

    /// Waits for a shutdown begun earlier to finish.
    pub async fn wait(&mut self) {
        if let Some(task) = self.task.take() {
            task.await.expect("holdfast task").expect("holdfast run");
        }
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        let resp = super::http::get(&format!("http://{}/metrics", self.admin)).await;
        String::from_utf8(resp.body.to_vec()).unwrap()
    }

    /// The value of one sample line in `/metrics` (`name{labels}` exactly as encoded), or 0.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics().await, series)
    }
}

/// Finds `series` (name with labels, as encoded) in OpenMetrics text; 0 when absent.
pub fn metric_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            l.strip_prefix(series)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

impl Drop for Holdfast {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
