//! NBD servers for the tests (nbdkit and qemu-nbd on loopback: a Unix
//! socket or a TCP port on 127.0.0.1), started as children of the test,
//! killed and restarted on demand, always stopped on drop; and moving
//! images in and out of an export through jext4's own NBD client.

use super::e2e::JextMount;
use jext4::dev::{BlockDevice, NbdDevice, NbdUri};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether nbdkit and qemu-nbd are installed (scripts/test.sh installs
/// them; a developer's machine may not have them: skip with a message).
pub fn servers_available() -> bool {
    super::require_tool("nbdkit")
        && super::require_tool("qemu-nbd")
        && super::require_tool("qemu-img")
}

/// Where a server listens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listen {
    Unix,
    Tcp,
}

pub struct NbdServer {
    child: Option<Child>,
    program: String,
    args: Vec<String>,
    pub socket: Option<PathBuf>,
    pub port: Option<u16>,
    /// The export's URI (default export).
    pub uri: String,
    pub log: PathBuf,
}

/// A free TCP port on 127.0.0.1 (bound and released: another process could
/// take it in between, which a test then reports as a failure to start).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

impl NbdServer {
    /// `nbdkit [filters and plugin arguments]` in the foreground, named
    /// `name` inside `dir` (socket, log).
    pub fn nbdkit(dir: &Path, name: &str, listen: Listen, args: &[&str]) -> NbdServer {
        let mut full: Vec<String> = vec!["--foreground".into(), "--exit-with-parent".into()];
        let (socket, port) = match listen {
            Listen::Unix => {
                let socket = dir.join(format!("{name}.sock"));
                full.extend(["--unix".into(), socket.display().to_string()]);
                (Some(socket), None)
            }
            Listen::Tcp => {
                let port = free_port();
                full.extend([
                    "--ipaddr".into(),
                    "127.0.0.1".into(),
                    "--port".into(),
                    port.to_string(),
                ]);
                (None, Some(port))
            }
        };
        full.extend(args.iter().map(|arg| arg.to_string()));
        NbdServer::spawn(dir, name, "nbdkit", full, socket, port)
    }

    /// `qemu-nbd` serving `image` in `format` (qcow2, raw) on a Unix
    /// socket, persistent (it stays for reconnects) and shared by up to 8
    /// connections.
    pub fn qemu_nbd(dir: &Path, name: &str, image: &Path, format: &str) -> NbdServer {
        let socket = dir.join(format!("{name}.sock"));
        let args = vec![
            "--persistent".to_string(),
            "--shared=8".into(),
            format!("--format={format}"),
            "--cache=writeback".into(),
            format!("--socket={}", socket.display()),
            image.display().to_string(),
        ];
        NbdServer::spawn(dir, name, "qemu-nbd", args, Some(socket), None)
    }

    fn spawn(
        dir: &Path,
        name: &str,
        program: &str,
        args: Vec<String>,
        socket: Option<PathBuf>,
        port: Option<u16>,
    ) -> NbdServer {
        let uri = match (&socket, port) {
            (Some(socket), _) => format!("nbd+unix:///?socket={}", socket.display()),
            (None, Some(port)) => format!("nbd://127.0.0.1:{port}/"),
            (None, None) => unreachable!("a server listens somewhere"),
        };
        let mut server = NbdServer {
            child: None,
            program: program.into(),
            args,
            socket,
            port,
            uri,
            log: dir.join(format!("{name}.server.log")),
        };
        server.start();
        server
    }

    /// Start the server (again, after `kill9`) and wait until it accepts
    /// connections.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        if let Some(socket) = &self.socket {
            let _ = std::fs::remove_file(socket);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("starting {}: {error}", self.program));
        self.child = Some(child);
        let started = Instant::now();
        while !self.accepts() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "{} {:?} exited ({status}):\n{}",
                    self.program,
                    self.args,
                    self.read_log()
                );
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "{} does not listen:\n{}",
                self.program,
                self.read_log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A connection succeeds (and is closed at once; both servers take a
    /// client that leaves during the handshake in their stride).
    fn accepts(&self) -> bool {
        match (&self.socket, self.port) {
            (Some(socket), _) => std::os::unix::net::UnixStream::connect(socket).is_ok(),
            (None, Some(port)) => std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
            (None, None) => false,
        }
    }

    /// The URI of export `name`, with extra `params` (`x-...=...`).
    pub fn uri_with(&self, export: &str, params: &str) -> String {
        let base = match (&self.socket, self.port) {
            (Some(socket), _) => format!("nbd+unix:///{export}?socket={}", socket.display()),
            (None, Some(port)) => format!("nbd://127.0.0.1:{port}/{export}"),
            (None, None) => unreachable!(),
        };
        match (params.is_empty(), base.contains('?')) {
            (true, _) => base,
            (false, true) => format!("{base}&{params}"),
            (false, false) => format!("{base}?{params}"),
        }
    }

    /// SIGKILL: the server's own caches are lost, what it wrote to its
    /// backing file stays.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the pid of our own unreaped child.
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
        }
    }

    /// SIGSTOP (`true`) or SIGCONT: a hung server, which keeps its
    /// connections open and its socket listening but answers nothing.
    pub fn freeze(&self, frozen: bool) {
        if let Some(child) = &self.child {
            let signal = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
            // SAFETY: kill(2) on the pid of our own unreaped child.
            unsafe { libc::kill(child.id() as i32, signal) };
        }
    }

    pub fn read_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.freeze(false);
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the pid of our own unreaped child; SIGTERM
            // lets qemu-nbd and nbdkit flush and remove their sockets.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if child.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Open `uri` with jext4's client.
pub fn device(uri: &str) -> NbdDevice {
    let parsed = NbdUri::parse(uri).unwrap();
    NbdDevice::open(&parsed, false).unwrap_or_else(|error| panic!("{uri}: {error}"))
}

/// Copy a local image into the export (which must be at least as large),
/// then flush.
pub fn upload(image: &Path, uri: &str) {
    let bytes = std::fs::read(image).unwrap();
    let device = device(uri);
    assert!(
        device.size_bytes() >= bytes.len() as u64,
        "export too small"
    );
    for (index, chunk) in bytes.chunks(4 << 20).enumerate() {
        device.write_at(index as u64 * (4 << 20), chunk).unwrap();
    }
    device.flush().unwrap();
}

/// Copy the first `size` bytes of the export into a local file.
pub fn download(uri: &str, image: &Path, size: u64) {
    let device = device(uri);
    let mut bytes = vec![0u8; size as usize];
    device.read_at(0, &mut bytes).unwrap();
    std::fs::write(image, bytes).unwrap();
}

/// `jext4 mount URI DIR/mnt`, the server's log in `DIR/jext4.log`; returns
/// the mount and its mount point.
pub fn mount(dir: &Path, uri: &str) -> (JextMount, PathBuf) {
    let mountpoint = dir.join("mnt");
    let log = dir.join("jext4.log");
    let mount = JextMount::try_mount_logged(Path::new(uri), &mountpoint, "", log).unwrap_or_else(
        |(output, log)| {
            panic!(
                "jext4 mount {uri}: {}\n{log}",
                String::from_utf8_lossy(&output.stderr)
            )
        },
    );
    (mount, mountpoint)
}
