//! A MySQL-protocol server in a container, for machines where a Docker engine answers.
//!
//! The image is `mysql:8.4` unless `TESTDB_CONTAINER_IMAGE` names another (`name:tag`), such as
//! the local MariaDB image `scripts/containers image` builds from Debian's packages; the
//! server is ready when its standard error shows `TESTDB_CONTAINER_WAIT` (for `mysql:8.4`,
//! `port: 3306`; for other images nothing unless the variable says) and it answers `SELECT 1`.
//! The engine is the one `DOCKER_HOST` names.
//!
//! The container is started with testcontainers, then owned by this module by id: it is
//! removed with `docker rm --force` when the server drops or the process exits, so removal
//! does not depend on which async runtime happens to be alive at that moment.
//!
//! testcontainers 0.28 does not negotiate the engine's API version: it works with engines
//! older than its own API (Debian's 20.10 speaks 1.41) because bollard 0.21 sends unversioned
//! request paths. `make check` pins that bollard, and the description of every container
//! server names the engine's API version, as the engine answered `docker version`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testcontainers::core::{IntoContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{GenericImage, ImageExt};

use crate::cleanup::{register, Cleanup};
use crate::error::Error;
use crate::provision;
use crate::settings::{env, READY_TIMEOUT};

/// The image the container backend runs unless [`TESTDB_CONTAINER_IMAGE`] names another.
pub const DEFAULT_IMAGE: &str = "mysql:8.4";
/// Names the image (`name:tag`) the container backend runs.
pub const TESTDB_CONTAINER_IMAGE: &str = "TESTDB_CONTAINER_IMAGE";
/// The line on the container's standard error that says the server is up.
pub const TESTDB_CONTAINER_WAIT: &str = "TESTDB_CONTAINER_WAIT";

/// The image, split into name and tag, and the ready message to wait for, if any.
fn image() -> Result<(String, String, Option<String>), Error> {
    parse_image(
        env(TESTDB_CONTAINER_IMAGE).as_deref(),
        env(TESTDB_CONTAINER_WAIT),
    )
}

fn parse_image(
    image: Option<&str>,
    wait: Option<String>,
) -> Result<(String, String, Option<String>), Error> {
    let (name, tag) = match image {
        None => ("mysql", "8.4"),
        Some(image) => image
            .rsplit_once(':')
            .filter(|(name, tag)| !name.is_empty() && !tag.is_empty() && !tag.contains('/'))
            .ok_or_else(|| {
                Error::Config(format!(
                    "{TESTDB_CONTAINER_IMAGE}={image:?} is not name:tag (such as {DEFAULT_IMAGE})"
                ))
            })?,
    };
    let wait = wait.or_else(|| image.is_none().then(|| "port: 3306".to_owned()));
    Ok((name.to_owned(), tag.to_owned(), wait))
}

/// The engine's version and API version, as `docker version` reports them.
fn engine_version() -> String {
    Command::new("docker")
        .args([
            "version",
            "--format",
            "{{.Server.Version}}, API {{.Server.APIVersion}}",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "version unknown".into())
}

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
        let (name, tag, wait) = image()?;
        let (id, port) = provision::block_on(async {
            let container = GenericImage::new(&name, &tag)
                .with_exposed_port(3306.tcp())
                .with_wait_for(match &wait {
                    Some(line) => WaitFor::message_on_stderr(line.as_str()),
                    None => WaitFor::Nothing,
                })
                .with_env_var("MYSQL_ALLOW_EMPTY_PASSWORD", "yes")
                .with_startup_timeout(READY_TIMEOUT)
                .start()
                .await
                .map_err(|e| Error::Container(format!("starting {name}:{tag} failed: {e}")))?;
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
        let url = provision::url("root", "", &format!("127.0.0.1:{port}"), None, "");
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
            "{version} (container {name}:{tag}, engine {}, 127.0.0.1:{port})",
            engine_version()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_is_name_and_tag_and_only_the_default_has_a_default_wait() {
        let (name, tag, wait) = parse_image(None, None).unwrap();
        assert_eq!((name.as_str(), tag.as_str()), ("mysql", "8.4"));
        assert_eq!(wait.as_deref(), Some("port: 3306"));
        let (name, tag, wait) = parse_image(Some("localhost:5000/a/b:10.11"), None).unwrap();
        assert_eq!(
            (name.as_str(), tag.as_str()),
            ("localhost:5000/a/b", "10.11")
        );
        assert_eq!(wait, None);
        let wait = parse_image(Some("x:1"), Some("ready".into())).unwrap().2;
        assert_eq!(wait.as_deref(), Some("ready"));
        for bad in ["mysql", "mysql:", ":8.4", "localhost:5000/mysql"] {
            let e = parse_image(Some(bad), None).unwrap_err().to_string();
            assert!(
                e.starts_with("TESTDB_CONTAINER_IMAGE=") && e.contains("is not name:tag"),
                "{bad}: {e}"
            );
        }
    }
}
