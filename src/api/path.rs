//! Paths as ext4 sees them: bytes. A name is any byte string without
//! '/' and NUL, so paths go through `OsStrExt`, never through `str`.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// The bytes of a path.
pub(super) fn bytes(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

/// A path made of bytes read from the image (a link's target).
pub(super) fn path_from_bytes(bytes: Vec<u8>) -> PathBuf {
    PathBuf::from(OsString::from_vec(bytes))
}

/// The names a path walks through, "." and empty components left out
/// ("..", a real entry of every ext4 directory, is kept).
pub(super) fn components(path: &[u8]) -> Vec<Vec<u8>> {
    path.split(|&b| b == b'/')
        .filter(|part| !part.is_empty() && *part != b".")
        .map(<[u8]>::to_vec)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_keep_dot_dot_and_drop_dots_and_empties() {
        assert_eq!(
            components(b"/a//./b/../c/"),
            vec![b"a".to_vec(), b"b".to_vec(), b"..".to_vec(), b"c".to_vec()]
        );
        assert!(components(b"").is_empty());
        assert!(components(b"///").is_empty());
        assert_eq!(components(b"\xff\xfe"), vec![b"\xff\xfe".to_vec()]);
    }
}
