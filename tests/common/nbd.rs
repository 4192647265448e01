//! NBD servers for the tests (nbdkit and qemu-nbd on loopback: a Unix
//! socket or a TCP port on 127.0.0.1), started as children of the test,
//! killed and restarted on demand, always stopped on drop; and moving
//! images in and out of an export through jext4's own NBD client.

use super::e2e::JextMount;
use jext4::engine::dev::{BlockDevice, NbdDevice, NbdUri};
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

/// Starts of a TCP server tried, each on a new port, before a test fails:
/// a port found free may be taken by another process before the server
/// binds it (the server then exits with EADDRINUSE).
const TCP_START_ATTEMPTS: usize = 5;

/// A free TCP port on 127.0.0.1, never one this process handed out
/// before, and below the kernel's ephemeral range: the kernel gives
/// ephemeral ports to every `bind(0)` and outgoing connection, so one
/// taken from there could go to another test (two servers would then
/// race for it: the loser exits, and its test's client reaches the
/// winner, another test's export) or, while a server is down between
/// `kill9` and `start`, to any connection on the machine.
fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap();
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    // Where to start looking: a different place in each test process, so
    // that test binaries run side by side rarely try the same ports.
    const LOWEST: u16 = 10_000;
    let span = ephemeral_start.saturating_sub(LOWEST).max(1) as u32;
    let mut candidate = LOWEST as u32 + (std::process::id() * 7_919) % span;
    for _ in 0..span {
        let port = candidate as u16;
        candidate = LOWEST as u32 + (candidate - LOWEST as u32 + 1) % span;
        if handed_out.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.push(port);
            return port;
        }
    }
    panic!("no free TCP port on 127.0.0.1 between {LOWEST} and {ephemeral_start}");
}

/// nbdkit's arguments to listen where `listen` says, with its socket or
/// port.
fn nbdkit_listen(
    dir: &Path,
    name: &str,
    listen: Listen,
) -> (Vec<String>, Option<PathBuf>, Option<u16>) {
    match listen {
        Listen::Unix => {
            let socket = dir.join(format!("{name}.sock"));
            let args = vec!["--unix".into(), socket.display().to_string()];
            (args, Some(socket), None)
        }
        Listen::Tcp => {
            let port = free_port();
            let args = ["--ipaddr", "127.0.0.1", "--port", &port.to_string()].map(String::from);
            (args.to_vec(), None, Some(port))
        }
    }
}

impl NbdServer {
    /// `nbdkit [filters and plugin arguments]` in the foreground, named
    /// `name` inside `dir` (socket, log).
    pub fn nbdkit(dir: &Path, name: &str, listen: Listen, args: &[&str]) -> NbdServer {
        let mut attempt = 1;
        loop {
            let mut full: Vec<String> = vec!["--foreground".into(), "--exit-with-parent".into()];
            let (where_, socket, port) = nbdkit_listen(dir, name, listen);
            full.extend(where_);
            full.extend(args.iter().map(|arg| arg.to_string()));
            let mut server = NbdServer::new(dir, name, "nbdkit", full, socket, port);
            match server.try_start() {
                Ok(()) => return server,
                Err(why) if port.is_some() && attempt < TCP_START_ATTEMPTS => {
                    eprintln!("nbdkit on port {port:?} did not start ({why}); a new port");
                    attempt += 1;
                }
                Err(why) => panic!("{why}"),
            }
        }
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
        let mut server = NbdServer::new(dir, name, "qemu-nbd", args, Some(socket), None);
        server.start();
        server
    }

    fn new(
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
        NbdServer {
            child: None,
            program: program.into(),
            args,
            socket,
            port,
            uri,
            log: dir.join(format!("{name}.server.log")),
        }
    }

    /// Start the server (again, after `kill9`) and wait until it accepts
    /// connections.
    pub fn start(&mut self) {
        if let Err(why) = self.try_start() {
            panic!("{why}");
        }
    }

    /// `start`, saying why the server did not come up.
    fn try_start(&mut self) -> Result<(), String> {
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
                self.child = None;
                return Err(format!(
                    "{} {:?} exited ({status}):\n{}",
                    self.program,
                    self.args,
                    self.read_log()
                ));
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "{} does not listen:\n{}",
                self.program,
                self.read_log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// The server accepts connections: a connection to its Unix socket
    /// succeeds (and is closed at once; both servers take a client that
    /// leaves during the handshake in their stride), or its TCP port is
    /// listened on by this server's own process — not by another that
    /// holds the same port, which a connection would not tell apart.
    fn accepts(&self) -> bool {
        match (&self.socket, self.port, &self.child) {
            (Some(socket), _, _) => std::os::unix::net::UnixStream::connect(socket).is_ok(),
            (None, Some(port), Some(child)) => listens_on(child.id(), port),
            _ => false,
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

/// Process `pid` holds a socket listening on 127.0.0.1:`port` (or on
/// every address): the listening sockets' inodes from /proc/net/tcp,
/// looked for among the process's descriptors. The table prints an
/// address as the host-order hex of its 32-bit value: 127.0.0.1 is
/// `0100007F` on a little-endian machine, the only kind jext4 is tested
/// on (`7F000001` on a big-endian one, also accepted).
fn listens_on(pid: u32, port: u16) -> bool {
    const LISTEN: &str = "0A";
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let wanted = [
        format!("0100007F:{port:04X}"),
        format!("7F000001:{port:04X}"),
        format!("00000000:{port:04X}"),
    ];
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = *fields.get(1)?;
            let listening = fields.get(3) == Some(&LISTEN) && wanted.iter().any(|at| at == local);
            let inode = fields.get(9)?;
            listening.then(|| format!("socket:[{inode}]"))
        })
        .collect();
    let Ok(descriptors) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    descriptors.flatten().any(|entry| {
        std::fs::read_link(entry.path()).is_ok_and(|target| {
            inodes
                .iter()
                .any(|inode| target.as_os_str() == inode.as_str())
        })
    })
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
