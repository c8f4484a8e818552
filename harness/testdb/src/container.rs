//! MySQL 8.4 in a container, for machines where a Docker engine answers.
//!
//! The container is started with testcontainers, then owned by this module by id: it is
//! removed with `docker rm --force` when the server drops or the process exits, so removal
//! does not depend on which async runtime happens to be alive at that moment.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{GenericImage, ImageExt};

use crate::cleanup::{register, Cleanup};
use crate::{provision, Error, READY_TIMEOUT};

/// The image the container backend runs.
pub const IMAGE: (&str, &str) = ("mysql", "8.4");

/// Whether a Docker engine answers within five seconds (a client alone is not enough).
pub(crate) fn engine_answers() -> bool {
    let Ok(mut child) = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if start.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

/// A running MySQL container, removed on drop.
#[derive(Debug)]
pub(crate) struct ContainerServer {
    id: String,
    port: u16,
    description: String,
}

impl ContainerServer {
    pub(crate) fn start() -> Result<ContainerServer, Error> {
        let (id, port) = provision::block_on(async {
            let container = GenericImage::new(IMAGE.0, IMAGE.1)
                .with_exposed_port(3306.tcp())
                .with_wait_for(WaitFor::message_on_stderr("port: 3306"))
                .with_env_var("MYSQL_ALLOW_EMPTY_PASSWORD", "yes")
                .with_startup_timeout(READY_TIMEOUT)
                .start()
                .await
                .map_err(|e| {
                    Error::Container(format!("starting {}:{} failed: {e}", IMAGE.0, IMAGE.1))
                })?;
            let id = container.id().to_owned();
            let port = container
                .get_host_port_ipv4(3306.tcp())
                .await
                .map_err(|e| Error::Container(format!("no host port for the container: {e}")))?;
            // From here on the container is ours by id (see the module docs).
            std::mem::forget(container);
            Ok::<_, Error>((id, port))
        })?;
        register(Cleanup::Container { id: id.clone() });
        let mut server = ContainerServer {
            id,
            port,
            description: String::new(),
        };
        let url = provision::url("root", "", &format!("127.0.0.1:{port}"), None);
        let start = Instant::now();
        let version = loop {
            match provision::block_on(provision::select_version(url.clone())) {
                Ok(v) => break v,
                Err(e) if start.elapsed() > READY_TIMEOUT => {
                    return Err(Error::Container(format!(
                        "the container on 127.0.0.1:{port} did not answer SELECT 1: {e}"
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        server.description = format!(
            "{version} (container {}:{}, 127.0.0.1:{port})",
            IMAGE.0, IMAGE.1
        );
        Ok(server)
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn description(&self) -> &str {
        &self.description
    }
}

impl Drop for ContainerServer {
    fn drop(&mut self) {
        let _ = Command::new("docker")
            .args(["rm", "--force", "--volumes", &self.id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
