//! NBD URIs (the NBD project's `doc/uri.md`, on top of RFC 3986):
//! `nbd://HOST[:PORT]/EXPORT` and `nbd+unix:///EXPORT?socket=PATH`.
//!
//! The export name is the path without its leading `/`, percent-decoded
//! (`nbd://host/` and `nbd://host` both name the default export, the empty
//! string). TLS schemes (`nbds`, `nbds+unix`) are refused: jext4 speaks NBD
//! without TLS, so a URI that demands encryption must fail rather than fall
//! back to plain text (uri.md: "If encryption cannot be negotiated then the
//! connection MUST fail"). Unknown query parameters are refused too
//! (uri.md: they "SHOULD be diagnosed by the parser"); jext4's own
//! parameters carry the `x-` prefix the spec reserves for such use.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::time::Duration;

/// The IANA port of NBD (uri.md: the default when the URI names none).
pub const DEFAULT_PORT: u16 = 10809;
/// Connections used when the server allows several (`CAN_MULTI_CONN`) and
/// the URI does not say (`x-connections=`).
pub const DEFAULT_CONNECTIONS: usize = 4;
/// Upper bound of `x-connections=`.
pub const MAX_CONNECTIONS: usize = 16;
/// How long a lost connection is retried before the device gives up, when
/// the URI does not say (`x-reconnect-timeout=SECONDS`).
pub const DEFAULT_RECONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a reply may take before the connection is taken for lost,
/// when the URI does not say (`x-io-timeout=SECONDS`; 0: wait forever).
/// The kernel's `nbd` client waits 30 s by default too.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound of `x-reconnect-timeout=` and `x-io-timeout=`: one hour.
const MAX_TIMEOUT_SECONDS: u64 = 3600;
/// proto.md: strings "MUST be no longer than 4096 bytes".
const MAX_EXPORT_NAME: usize = 4096;

/// Schemes that name NBD (uri.md), whether or not jext4 supports them; a
/// path is taken for a URI only when it starts with one of these and `:`.
const NBD_SCHEMES: &[&str] = &[
    "nbd",
    "nbds",
    "nbd+unix",
    "nbds+unix",
    "nbd+vsock",
    "nbds+vsock",
];

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    Tcp {
        host: String,
        port: u16,
    },
    /// A socket file, or a name in Linux's abstract namespace (a `socket=`
    /// value that starts with NUL, written `%00`).
    Unix {
        path: PathBuf,
    },
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub transport: Transport,
    /// The export name (empty: the server's default export).
    pub export: String,
    /// Connections to open when the server allows several.
    pub connections: usize,
    /// How long a lost connection is retried.
    pub reconnect_timeout: Duration,
    /// How long a reply may take (`None`: forever); a server that stays
    /// silent longer is treated as a lost connection.
    pub io_timeout: Option<Duration>,
    /// The URI as given, for messages.
    text: String,
}

/// Whether `text` is meant as an NBD URI (rather than a file name), so
/// that a misspelt URI gets the URI parser's message, not "no such file".
pub fn is_nbd_uri(text: &str) -> bool {
    text.split_once(':').is_some_and(|(scheme, _)| {
        NBD_SCHEMES
            .iter()
            .any(|known| known.eq_ignore_ascii_case(scheme))
    })
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl NbdUri {
    /// Parse `text`; the error is one line that says what is wrong.
    pub fn parse(text: &str) -> Result<NbdUri, String> {
        let bad = |why: &str| format!("bad NBD URI '{text}': {why}");
        let Some((scheme, rest)) = text.split_once(':') else {
            return Err(bad("no scheme (nbd:// or nbd+unix://)"));
        };
        let scheme = scheme.to_ascii_lowercase();
        match scheme.as_str() {
            "nbd" | "nbd+unix" => {}
            "nbds" | "nbds+unix" | "nbds+vsock" => {
                return Err(bad(
                    "TLS (nbds) is not supported by jext4; use nbd:// or nbd+unix:// over a \
                     trusted network or a tunnel",
                ));
            }
            "nbd+vsock" => {
                return Err(bad(
                    "vsock transport is not supported; use nbd:// or nbd+unix://",
                ));
            }
            _ => return Err(bad("the scheme must be nbd or nbd+unix")),
        }
        let Some(rest) = rest.strip_prefix("//") else {
            return Err(bad("expected '//' after the scheme"));
        };
        if rest.contains('#') {
            return Err(bad("a fragment (#...) has no meaning in an NBD URI"));
        }
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = match before_query.find('/') {
            Some(at) => before_query.split_at(at),
            None => (before_query, ""),
        };
        let export = percent_decode(path.strip_prefix('/').unwrap_or(path))
            .and_then(|bytes| String::from_utf8(bytes).map_err(|_| "not UTF-8".to_string()))
            .map_err(|why| bad(&format!("export name: {why}")))?;
        if export.contains('\0') || export.len() > MAX_EXPORT_NAME {
            return Err(bad(
                "the export name must be at most 4096 bytes without NUL",
            ));
        }
        let mut uri = NbdUri {
            transport: Transport::Unix {
                path: PathBuf::new(),
            },
            export,
            connections: DEFAULT_CONNECTIONS,
            reconnect_timeout: DEFAULT_RECONNECT_TIMEOUT,
            io_timeout: Some(DEFAULT_IO_TIMEOUT),
            text: text.to_string(),
        };
        let mut socket = None;
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value).map_err(|why| bad(&format!("{key}: {why}")))?;
            match key {
                "socket" if scheme == "nbd+unix" => socket = Some(value),
                "x-connections" => {
                    uri.connections = parse_number(&value, 1, MAX_CONNECTIONS as u64)
                        .map(|n| n as usize)
                        .map_err(|why| bad(&format!("x-connections: {why}")))?
                }
                "x-reconnect-timeout" => {
                    let seconds = parse_number(&value, 0, MAX_TIMEOUT_SECONDS)
                        .map_err(|why| bad(&format!("x-reconnect-timeout: {why}")))?;
                    uri.reconnect_timeout = Duration::from_secs(seconds);
                }
                "x-io-timeout" => {
                    let seconds = parse_number(&value, 0, MAX_TIMEOUT_SECONDS)
                        .map_err(|why| bad(&format!("x-io-timeout: {why}")))?;
                    uri.io_timeout = (seconds > 0).then(|| Duration::from_secs(seconds));
                }
                key if key.starts_with("tls-") => {
                    return Err(bad("TLS parameters given, but jext4 does not support TLS"));
                }
                key => return Err(bad(&format!("unknown parameter '{key}'"))),
            }
        }
        uri.transport = if scheme == "nbd+unix" {
            if !authority.is_empty() {
                return Err(bad(
                    "nbd+unix:// takes no host (write nbd+unix:///EXPORT?socket=PATH)",
                ));
            }
            match socket {
                Some(path) if !path.is_empty() => Transport::Unix {
                    path: PathBuf::from(OsString::from_vec(path)),
                },
                _ => return Err(bad("nbd+unix:// needs ?socket=PATH")),
            }
        } else {
            parse_authority(authority).map_err(|why| bad(&why))?
        };
        Ok(uri)
    }

    /// The connection target, for messages ("unix socket /run/x.sock").
    pub fn endpoint(&self) -> String {
        match &self.transport {
            Transport::Tcp { host, port } => format!("{host}:{port}"),
            Transport::Unix { path } => format!("unix socket {}", path.display()),
        }
    }
}

/// `[userinfo@]host[:port]`, the host possibly a bracketed IPv6 literal.
fn parse_authority(authority: &str) -> Result<Transport, String> {
    if authority.contains('@') {
        return Err("user information is only used for TLS, which jext4 does not support".into());
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let Some((host, after)) = bracketed.split_once(']') else {
            return Err("unclosed '[' in the host".into());
        };
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err("unexpected text after the IPv6 address".into()),
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let host = String::from_utf8(percent_decode(host)?).map_err(|_| "host is not UTF-8")?;
    if host.is_empty() {
        return Err("nbd:// needs a host (nbd://HOST[:PORT]/EXPORT)".into());
    }
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|&port| port != 0)
            .ok_or_else(|| format!("port '{port}' is not a number from 1 to 65535"))?,
    };
    Ok(Transport::Tcp { host, port })
}

fn parse_number(text: &[u8], min: u64, max: u64) -> Result<u64, String> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| {
            format!(
                "'{}' is not a number from {min} to {max}",
                String::from_utf8_lossy(text)
            )
        })
}

/// RFC 3986 percent-decoding (`%20` → space); a `%` not followed by two
/// hex digits is an error.
fn percent_decode(text: &str) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes
                .get(at + 1..at + 3)
                .and_then(|pair| std::str::from_utf8(pair).ok())
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| format!("bad percent-escape at '{}'", &text[at..]))?;
            out.push(hex);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> Transport {
        Transport::Tcp {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn export_names_follow_the_uri_spec_table() {
        for (text, export) in [
            ("nbd://example.com/disk", "disk"),
            ("nbd://example.com/", ""),
            ("nbd://example.com", ""),
            ("nbd://example.com//disk", "/disk"),
            ("nbd://example.com/hello%20world", "hello world"),
        ] {
            let uri = NbdUri::parse(text).unwrap();
            assert_eq!(uri.export, export, "{text}");
            assert_eq!(uri.transport, tcp("example.com", DEFAULT_PORT));
            assert_eq!(uri.to_string(), text);
        }
    }

    #[test]
    fn hosts_ports_and_sockets() {
        let uri = NbdUri::parse("nbd://127.0.0.1:10810/x").unwrap();
        assert_eq!(uri.transport, tcp("127.0.0.1", 10810));
        let uri = NbdUri::parse("nbd://[::1]:99/x").unwrap();
        assert_eq!(uri.transport, tcp("::1", 99));
        assert_eq!(
            NbdUri::parse("nbd://[::1]").unwrap().transport,
            tcp("::1", DEFAULT_PORT)
        );
        let uri = NbdUri::parse("nbd+unix:///disk?socket=/run/nbd%20a.sock").unwrap();
        assert_eq!(
            uri.transport,
            Transport::Unix {
                path: "/run/nbd a.sock".into()
            }
        );
        assert_eq!(uri.export, "disk");
        let uri = NbdUri::parse("NBD+UNIX:///?socket=%00abstract").unwrap();
        assert_eq!(
            uri.transport,
            Transport::Unix {
                path: "\0abstract".into()
            }
        );
        let uri = NbdUri::parse("nbd://h/e?x-connections=2&x-reconnect-timeout=0").unwrap();
        assert_eq!(
            (uri.connections, uri.reconnect_timeout, uri.io_timeout),
            (2, Duration::ZERO, Some(DEFAULT_IO_TIMEOUT))
        );
        let uri = NbdUri::parse("nbd://h/e?x-io-timeout=5").unwrap();
        assert_eq!(uri.io_timeout, Some(Duration::from_secs(5)));
        assert_eq!(
            NbdUri::parse("nbd://h/e?x-io-timeout=0")
                .unwrap()
                .io_timeout,
            None
        );
    }

    #[test]
    fn bad_uris_get_one_line_each() {
        for (text, says) in [
            ("nbds://host/x", "TLS"),
            ("nbds+unix:///x?socket=/s", "TLS"),
            ("nbd://host/x?tls-type=x509", "TLS"),
            ("nbd+vsock://1/x", "vsock"),
            ("nbd:/host/x", "'//'"),
            ("nbd:///x", "needs a host"),
            ("nbd://host:0/x", "port"),
            ("nbd://host:99999/x", "port"),
            ("nbd://host:abc/x", "port"),
            ("nbd://u@host/x", "user information"),
            ("nbd://[::1/x", "unclosed"),
            ("nbd://host/x%zz", "percent-escape"),
            ("nbd://host/x%ff", "UTF-8"),
            ("nbd://host/a%00b", "NUL"),
            ("nbd://host/x?socket=/s", "unknown parameter 'socket'"),
            ("nbd://host/x?frobnicate=1", "unknown parameter"),
            ("nbd://host/x#frag", "fragment"),
            ("nbd+unix:///x", "socket=PATH"),
            ("nbd+unix:///x?socket=", "socket=PATH"),
            ("nbd+unix://host/x?socket=/s", "no host"),
            ("nbd://h/x?x-connections=0", "x-connections"),
            ("nbd://h/x?x-connections=17", "x-connections"),
            ("nbd://h/x?x-reconnect-timeout=-1", "x-reconnect-timeout"),
            ("nbd://h/x?x-io-timeout=3601", "x-io-timeout"),
        ] {
            let error = NbdUri::parse(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
            assert!(error.contains(text) && !error.contains('\n'), "{error}");
        }
    }

    #[test]
    fn only_nbd_schemes_are_taken_for_uris() {
        assert!(is_nbd_uri("nbd://h/x"));
        assert!(is_nbd_uri("nbds+unix:///x"));
        assert!(is_nbd_uri("NBD:oops"));
        assert!(!is_nbd_uri("disk.img"));
        assert!(!is_nbd_uri("/tmp/nbd:x"));
        assert!(!is_nbd_uri("http://x/y"));
    }
}
