//! The NBD wire protocol, client side (the NBD project's `doc/proto.md`):
//! the fixed newstyle handshake ending in `NBD_OPT_GO` (with the block-size
//! constraints requested) or, for servers without it, `NBD_OPT_EXPORT_NAME`;
//! then requests and simple replies. Structured replies are not negotiated,
//! so every reply is a simple one and a read's payload follows its header.
//!
//! One `Connection` carries one request at a time: the caller sends a
//! request and reads its reply before the next (`NbdDevice` gets
//! concurrency from several connections instead of pipelining).
//!
//! Every number on the wire is big-endian.

use super::uri::{NbdUri, Transport};
use std::io::{self, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
/// Oldstyle servers send this where newstyle ones send IHAVEOPT.
const CLISERV_MAGIC: u64 = 0x0000_4202_8186_1253;
const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;
const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;

// Options.
const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_GO: u32 = 7;

// Option replies.
const REP_ACK: u32 = 1;
const REP_INFO: u32 = 3;
const REP_FLAG_ERROR: u32 = 1 << 31;
const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;

// Information types.
const INFO_EXPORT: u16 = 0;
const INFO_BLOCK_SIZE: u16 = 3;

// Commands and command flags.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_FLAG_FUA: u16 = 1 << 0;

/// `NBD_ESHUTDOWN`: the server is going away; the client must disconnect
/// (and here, reconnect).
pub const ESHUTDOWN: u32 = 108;

/// proto.md: a client "SHOULD" limit reads and writes to 2^25 bytes when
/// the server states no maximum, and may always stay under it.
pub const DEFAULT_MAX_PAYLOAD: u32 = 1 << 25;
/// Replies to options carry at most this much data here (error strings,
/// information): a larger length is a broken or hostile server.
const MAX_OPTION_REPLY: u32 = 1 << 16;
/// Connecting and the handshake may take this long; a server that accepts
/// and then says nothing must not hang a mount.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of replies read at once.
const REPLY_BUFFER: usize = 64 * 1024;

/// What the server said about the export in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    pub size: u64,
    pub flags: u16,
    /// `NBD_INFO_BLOCK_SIZE`; (1, 4096, 2^25) when the server sent none.
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_payload: u32,
}

impl ExportInfo {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

/// Why a request did not succeed.
#[derive(Debug)]
pub enum RequestError {
    /// The connection broke (or the server broke the protocol): the request
    /// may or may not have been carried out; reconnect and send it again.
    Transport(io::Error),
    /// The server carried the request out and answered with this error
    /// (an `NBD_E*` value, numerically the Linux errno).
    Server(u32),
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn connect(uri: &NbdUri) -> io::Result<Stream> {
        match &uri.transport {
            Transport::Tcp { host, port } => {
                let mut last = None;
                let addresses = (host.as_str(), *port).to_socket_addrs().map_err(|error| {
                    io::Error::new(error.kind(), format!("cannot resolve {host}: {error}"))
                })?;
                for address in addresses {
                    match TcpStream::connect_timeout(&address, HANDSHAKE_TIMEOUT) {
                        Ok(stream) => {
                            // proto.md: both sides SHOULD disable Nagle.
                            stream.set_nodelay(true)?;
                            set_keepalive(&stream);
                            return Ok(Stream::Tcp(stream));
                        }
                        Err(error) => last = Some(error),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"))
                }))
            }
            Transport::Unix { path } => {
                use std::os::unix::ffi::OsStrExt;
                let bytes = path.as_os_str().as_bytes();
                if let Some(name) = bytes.strip_prefix(b"\0") {
                    use std::os::linux::net::SocketAddrExt;
                    let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                    return UnixStream::connect_addr(&address).map(Stream::Unix);
                }
                UnixStream::connect(path).map(Stream::Unix)
            }
        }
    }

    fn set_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
            Stream::Unix(s) => {
                s.set_read_timeout(timeout)?;
                s.set_write_timeout(timeout)
            }
        }
    }
}

/// A peer that vanishes without a word must be noticed on TCP too.
fn set_keepalive(stream: &TcpStream) {
    use std::os::unix::io::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: setsockopt reads one c_int from the pointer we pass, on a
    // socket we own; failure only loses the keepalive.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_KEEPALIVE,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn read_u16(stream: &mut impl Read) -> io::Result<u16> {
    let mut bytes = [0; 2];
    stream.read_exact(&mut bytes)?;
    Ok(u16::from_be_bytes(bytes))
}

fn read_u32(stream: &mut impl Read) -> io::Result<u32> {
    let mut bytes = [0; 4];
    stream.read_exact(&mut bytes)?;
    Ok(u32::from_be_bytes(bytes))
}

fn read_u64(stream: &mut impl Read) -> io::Result<u64> {
    let mut bytes = [0; 8];
    stream.read_exact(&mut bytes)?;
    Ok(u64::from_be_bytes(bytes))
}

pub fn protocol_error(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// The handshake failed in a way that retrying cannot mend (no such export,
/// TLS required, not an NBD server): reconnecting stops at once.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

fn refused(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, Refused(what))
}

/// Whether a handshake error is final (see `Refused`).
pub fn is_refusal(error: &io::Error) -> bool {
    error
        .get_ref()
        .is_some_and(|inner| inner.downcast_ref::<Refused>().is_some())
}

pub struct Connection {
    /// Replies are read through a buffer: a batch of write replies costs
    /// one system call, not one each. Requests go straight to the socket.
    stream: BufReader<Stream>,
    cookie: u64,
}

impl Connection {
    /// Connect and negotiate the export named in `uri`.
    pub fn open(uri: &NbdUri) -> io::Result<(Connection, ExportInfo)> {
        let stream = Stream::connect(uri)?;
        let handshake_timeout = uri
            .io_timeout
            .map_or(HANDSHAKE_TIMEOUT, |io| io.min(HANDSHAKE_TIMEOUT));
        stream.set_timeout(Some(handshake_timeout))?;
        let mut connection = Connection {
            stream: BufReader::with_capacity(REPLY_BUFFER, stream),
            cookie: 0,
        };
        let info = connection
            .handshake(&uri.export)
            .map_err(|error| match error.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the server did not answer the handshake within {handshake_timeout:?}"),
                ),
                _ => error,
            })?;
        connection.stream.get_ref().set_timeout(uri.io_timeout)?;
        Ok((connection, info))
    }

    fn handshake(&mut self, export: &str) -> io::Result<ExportInfo> {
        let stream = &mut self.stream;
        let magic = read_u64(stream)?;
        if magic != NBDMAGIC {
            return Err(refused(
                "the server does not speak NBD (no NBDMAGIC)".into(),
            ));
        }
        match read_u64(stream)? {
            IHAVEOPT => {}
            CLISERV_MAGIC => {
                return Err(refused(
                    "the server uses the oldstyle NBD handshake, which jext4 does not support"
                        .into(),
                ));
            }
            other => return Err(refused(format!("unknown NBD handshake magic {other:#x}"))),
        }
        let server_flags = read_u16(stream)?;
        let mut client_flags = 0;
        if server_flags & FLAG_FIXED_NEWSTYLE != 0 {
            client_flags |= FLAG_C_FIXED_NEWSTYLE;
        }
        if server_flags & FLAG_NO_ZEROES != 0 {
            client_flags |= FLAG_C_NO_ZEROES;
        }
        stream.get_mut().write_all(&client_flags.to_be_bytes())?;
        if server_flags & FLAG_FIXED_NEWSTYLE != 0
            && let Some(info) = self.option_go(export)?
        {
            return Ok(info);
        }
        self.option_export_name(export, server_flags & FLAG_NO_ZEROES != 0)
    }

    fn send_option(&mut self, option: u32, data: &[u8]) -> io::Result<()> {
        let mut message = Vec::with_capacity(16 + data.len());
        message.extend_from_slice(&IHAVEOPT.to_be_bytes());
        message.extend_from_slice(&option.to_be_bytes());
        message.extend_from_slice(&(data.len() as u32).to_be_bytes());
        message.extend_from_slice(data);
        self.stream.get_mut().write_all(&message)
    }

    /// One option reply: (type, data).
    fn read_option_reply(&mut self, option: u32) -> io::Result<(u32, Vec<u8>)> {
        let magic = read_u64(&mut self.stream)?;
        let replied_to = read_u32(&mut self.stream)?;
        let kind = read_u32(&mut self.stream)?;
        let length = read_u32(&mut self.stream)?;
        if magic != OPTION_REPLY_MAGIC || replied_to != option || length > MAX_OPTION_REPLY {
            return Err(refused(format!(
                "malformed option reply (magic {magic:#x}, option {replied_to}, length {length})"
            )));
        }
        let mut data = vec![0; length as usize];
        self.stream.read_exact(&mut data)?;
        Ok((kind, data))
    }

    /// `NBD_OPT_GO` asking for the block-size constraints. `None`: the
    /// server does not know the option (fall back to EXPORT_NAME).
    fn option_go(&mut self, export: &str) -> io::Result<Option<ExportInfo>> {
        let mut data = Vec::with_capacity(8 + export.len());
        data.extend_from_slice(&(export.len() as u32).to_be_bytes());
        data.extend_from_slice(export.as_bytes());
        data.extend_from_slice(&1u16.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        self.send_option(OPT_GO, &data)?;
        let mut export_info: Option<(u64, u16)> = None;
        let mut sizes = (1, 4096, DEFAULT_MAX_PAYLOAD);
        loop {
            let (kind, data) = self.read_option_reply(OPT_GO)?;
            match kind {
                REP_INFO => match data.get(..2).map(|t| u16::from_be_bytes([t[0], t[1]])) {
                    Some(INFO_EXPORT) if data.len() == 12 => {
                        let size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                        let flags = u16::from_be_bytes([data[10], data[11]]);
                        export_info = Some((size, flags));
                    }
                    Some(INFO_BLOCK_SIZE) if data.len() == 14 => {
                        let word =
                            |at: usize| u32::from_be_bytes(data[at..at + 4].try_into().unwrap());
                        sizes = (word(2), word(6), word(10));
                    }
                    // proto.md: the client MUST ignore information it does
                    // not understand.
                    _ => {}
                },
                REP_ACK => {
                    let Some((size, flags)) = export_info else {
                        return Err(refused(
                            "the server accepted NBD_OPT_GO without NBD_INFO_EXPORT".into(),
                        ));
                    };
                    return Ok(Some(checked_info(size, flags, sizes)?));
                }
                REP_ERR_UNSUP => return Ok(None),
                error => return Err(self.option_failure(export, error, &data)),
            }
        }
    }

    /// The error an option reply stands for, in words; the session is
    /// ended politely first (proto.md: the client uses a soft disconnect).
    fn option_failure(&mut self, export: &str, error: u32, data: &[u8]) -> io::Error {
        let said = String::from_utf8_lossy(data);
        let said = if said.is_empty() {
            String::new()
        } else {
            format!(" (server: {said})")
        };
        let _ = self.send_option(OPT_ABORT, &[]);
        let what = match error {
            REP_ERR_UNKNOWN => format!("the server has no export named '{export}'"),
            REP_ERR_TLS_REQD => "the server requires TLS, which jext4 does not support".into(),
            REP_ERR_POLICY => format!("the server refuses export '{export}' (policy)"),
            REP_ERR_BLOCK_SIZE_REQD => {
                "the server insists on block-size constraints it did not send".into()
            }
            REP_ERR_SHUTDOWN => {
                // Not final: the server is restarting.
                return io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    format!("the server is shutting down{said}"),
                );
            }
            error if error & REP_FLAG_ERROR != 0 => {
                format!("the server refused export '{export}' (error {:#x})", error)
            }
            other => format!("unexpected option reply {other}"),
        };
        refused(format!("{what}{said}"))
    }

    /// The old way into transmission: no error reply is possible, so a
    /// missing export shows as a closed connection.
    fn option_export_name(&mut self, export: &str, no_zeroes: bool) -> io::Result<ExportInfo> {
        self.send_option(OPT_EXPORT_NAME, export.as_bytes())?;
        let size = read_u64(&mut self.stream).map_err(|error| match error.kind() {
            io::ErrorKind::UnexpectedEof => refused(format!(
                "the server closed the connection on export '{export}' (no such export?)"
            )),
            _ => error,
        })?;
        let flags = read_u16(&mut self.stream)?;
        if !no_zeroes {
            let mut zeroes = [0u8; 124];
            self.stream.read_exact(&mut zeroes)?;
        }
        checked_info(size, flags, (1, 4096, DEFAULT_MAX_PAYLOAD))
    }

    /// Read exactly `buf.len()` bytes of a reply (a read's data, after
    /// `receive_reply` named it); the end of the stream means the server
    /// went away.
    pub fn receive_payload(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.stream
            .read_exact(buf)
            .map_err(|error| match error.kind() {
                io::ErrorKind::UnexpectedEof => io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the server closed the connection",
                ),
                // SO_RCVTIMEO ran out (`x-io-timeout`): the reply may
                // have been half read, so the connection cannot be
                // used again; the caller reconnects.
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no reply from the server within x-io-timeout",
                ),
                _ => error,
            })
    }

    /// Send a request without waiting for its reply; returns its cookie.
    /// Replies may come in any order (proto.md): `receive_reply` reads them.
    pub fn send_request(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: Option<&[u8]>,
    ) -> io::Result<u64> {
        debug_assert!(payload.is_none_or(|data| data.len() == length as usize));
        debug_assert_eq!(payload.is_some(), command == CMD_WRITE);
        self.cookie = self.cookie.wrapping_add(1);
        let cookie = self.cookie;
        let mut header = [0u8; 28];
        header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        header[4..6].copy_from_slice(&flags.to_be_bytes());
        header[6..8].copy_from_slice(&command.to_be_bytes());
        header[8..16].copy_from_slice(&cookie.to_be_bytes());
        header[16..24].copy_from_slice(&offset.to_be_bytes());
        header[24..28].copy_from_slice(&length.to_be_bytes());
        self.send(&header, payload)?;
        Ok(cookie)
    }

    /// The next simple reply's header: (cookie, error). For a successful
    /// read the caller then takes its data with `receive_payload`.
    pub fn receive_reply(&mut self) -> io::Result<(u64, u32)> {
        let mut reply = [0u8; 16];
        self.receive_payload(&mut reply)?;
        let magic = u32::from_be_bytes(reply[0..4].try_into().unwrap());
        let error = u32::from_be_bytes(reply[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(reply[8..16].try_into().unwrap());
        if magic != SIMPLE_REPLY_MAGIC {
            let what = if magic == STRUCTURED_REPLY_MAGIC {
                "a structured reply, which was not negotiated".to_string()
            } else {
                format!("reply magic {magic:#x}")
            };
            return Err(protocol_error(format!(
                "the server broke the protocol: {what}"
            )));
        }
        Ok((cookie, error))
    }

    /// One request and its reply, on a connection with nothing else in
    /// flight (the replay after a reconnect).
    pub fn request(
        &mut self,
        command: u16,
        offset: u64,
        payload: Option<&[u8]>,
    ) -> Result<(), RequestError> {
        let length = payload.map_or(0, |data| data.len() as u32);
        let cookie = self
            .send_request(command, 0, offset, length, payload)
            .map_err(RequestError::Transport)?;
        let (replied, error) = self.receive_reply().map_err(RequestError::Transport)?;
        if replied != cookie {
            return Err(RequestError::Transport(protocol_error(format!(
                "the server answered cookie {replied}, expected {cookie}"
            ))));
        }
        match error {
            0 => Ok(()),
            error => Err(RequestError::Server(error)),
        }
    }

    /// One read, waited for: the reply's data lands in `into`.
    pub fn read(&mut self, offset: u64, into: &mut [u8]) -> Result<(), RequestError> {
        let cookie = self
            .send_request(CMD_READ, 0, offset, into.len() as u32, None)
            .map_err(RequestError::Transport)?;
        let (replied, error) = self.receive_reply().map_err(RequestError::Transport)?;
        if replied != cookie {
            return Err(RequestError::Transport(protocol_error(format!(
                "the server answered cookie {replied}, expected {cookie}"
            ))));
        }
        match error {
            0 => self.receive_payload(into).map_err(RequestError::Transport),
            error => Err(RequestError::Server(error)),
        }
    }

    /// Header and payload in as few system calls as is cheap: small
    /// payloads are copied behind the header, large ones sent after it.
    fn send(&mut self, header: &[u8; 28], payload: Option<&[u8]>) -> io::Result<()> {
        match payload {
            Some(data) if data.len() <= 64 * 1024 => {
                let mut message = Vec::with_capacity(header.len() + data.len());
                message.extend_from_slice(header);
                message.extend_from_slice(data);
                self.stream.get_mut().write_all(&message)
            }
            Some(data) => {
                self.stream.get_mut().write_all(header)?;
                self.stream.get_mut().write_all(data)
            }
            None => self.stream.get_mut().write_all(header),
        }
    }

    /// `NBD_CMD_DISC`: the polite end of a session (no reply comes).
    pub fn disconnect(mut self) {
        let mut header = [0u8; 28];
        header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        header[6..8].copy_from_slice(&CMD_DISC.to_be_bytes());
        let _ = self.send(&header, None);
    }
}

/// Validate what the server said (proto.md, "Size constraints").
fn checked_info(size: u64, flags: u16, sizes: (u32, u32, u32)) -> io::Result<ExportInfo> {
    let (min_block, preferred_block, max_payload) = sizes;
    if flags & FLAG_HAS_FLAGS == 0 {
        return Err(refused(format!(
            "transmission flags {flags:#x} lack NBD_FLAG_HAS_FLAGS"
        )));
    }
    if !min_block.is_power_of_two() || min_block > 65536 || max_payload < min_block {
        return Err(refused(format!(
            "impossible block-size constraints: minimum {min_block}, preferred {preferred_block}, \
             maximum payload {max_payload}"
        )));
    }
    Ok(ExportInfo {
        size,
        flags,
        min_block,
        preferred_block,
        max_payload: max_payload.min(DEFAULT_MAX_PAYLOAD),
    })
}
