//! `IMAGE:PATH`, the e2tools and scp convention for naming a path inside
//! an image on the command line.
//!
//! An argument names a path inside an image when the text before one of
//! its colons is an existing file or block device (not a directory, so a
//! host path with a colon in a directory name stays a host path); the
//! first such colon from the left is the separator. `PATH` is absolute
//! inside the image; an empty one is the root. An image that cannot be
//! written that way (an NBD URI has colons of its own) is given once
//! (`--image URI`) and the paths as `:PATH`.

use std::path::{Path, PathBuf};

/// A path inside an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImagePath {
    /// The image file, block device or NBD URI.
    pub image: PathBuf,
    /// Absolute, as written (a trailing `/` kept: it means a directory).
    pub path: String,
}

impl ImagePath {
    /// `arg` as an image path, or None when it names a host path.
    /// `default_image` is the `--image` given, which `:PATH` refers to.
    pub fn parse(arg: &str, default_image: Option<&Path>) -> Option<ImagePath> {
        if let (Some(rest), Some(image)) = (arg.strip_prefix(':'), default_image) {
            return Some(ImagePath::new(image.to_path_buf(), rest));
        }
        for (at, _) in arg.match_indices(':') {
            let candidate = Path::new(&arg[..at]);
            if at > 0 && is_image_file(candidate) {
                return Some(ImagePath::new(candidate.to_path_buf(), &arg[at + 1..]));
            }
        }
        None
    }

    fn new(image: PathBuf, path: &str) -> ImagePath {
        let path = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("/{path}")
        };
        ImagePath { image, path }
    }

    /// The path without trailing slashes ("/" stays "/").
    pub fn trimmed(&self) -> &str {
        trim_slashes(&self.path)
    }
}

/// `path` without its trailing slashes, "/" for the root.
pub fn trim_slashes(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" => "/",
        trimmed => trimmed,
    }
}

/// The last component of an image path ("" for the root).
pub fn file_name(path: &str) -> &str {
    let trimmed = trim_slashes(path);
    trimmed.rsplit('/').next().unwrap_or("")
}

/// `dir` and `name` joined with one slash.
pub fn join(dir: &str, name: &str) -> String {
    let dir = trim_slashes(dir);
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn is_image_file(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() || m.file_type().is_block_device())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_file_before_the_colon_makes_an_image_path() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, b"").unwrap();
        let arg = format!("{}:/etc/passwd", image.display());
        let parsed = ImagePath::parse(&arg, None).unwrap();
        assert_eq!(parsed.image, image);
        assert_eq!(parsed.path, "/etc/passwd");
        let root = ImagePath::parse(&format!("{}:", image.display()), None).unwrap();
        assert_eq!(root.path, "/");
        let relative = ImagePath::parse(&format!("{}:a/", image.display()), None).unwrap();
        assert_eq!((relative.path.as_str(), relative.trimmed()), ("/a/", "/a"));
        // A directory with a colon in its name, and a missing file: host paths.
        let colon_dir = dir.path().join("a:b");
        std::fs::create_dir(&colon_dir).unwrap();
        assert_eq!(
            ImagePath::parse(&format!("{}/x", colon_dir.display()), None),
            None
        );
        assert_eq!(ImagePath::parse("/nonexistent.img:/x", None), None);
        assert_eq!(ImagePath::parse("plain/host/path", None), None);
    }

    #[test]
    fn colon_paths_refer_to_the_image_given_apart() {
        let uri = Path::new("nbd://host:10809/export");
        let parsed = ImagePath::parse(":/boot", Some(uri)).unwrap();
        assert_eq!(
            (parsed.image.as_path(), parsed.path.as_str()),
            (uri, "/boot")
        );
        assert_eq!(ImagePath::parse(":/boot", None), None);
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a/", "b"), "/a/b");
        assert_eq!(file_name("/a/b/"), "b");
        assert_eq!(file_name("/"), "");
    }
}
