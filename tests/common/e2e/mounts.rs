//! jext4 FUSE mounts and kernel loop mounts that always unmount, even when
//! a test panics.

use super::*;

static MOUNT_SERIAL: AtomicUsize = AtomicUsize::new(0);

/// A jext4 FUSE mount made with the built binary. Dropping it unmounts
/// (`jext4 umount`, then `fusermount3 -u -z` if that failed), so a failing
/// test never leaves a mount behind.
pub struct JextMount {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    pub log: PathBuf,
    /// What `jext4 mount` printed on stderr (it succeeded).
    pub mount_stderr: String,
    mounted: bool,
}

impl JextMount {
    /// Mount `image` on `mountpoint` (created if missing) with `-o options`
    /// (empty: none); panics with the server's message on failure.
    pub fn mount(image: &Path, mountpoint: &Path, options: &str) -> JextMount {
        match JextMount::try_mount(image, mountpoint, options) {
            Ok(mount) => mount,
            Err((output, log)) => panic!(
                "jext4 mount {} failed ({}): {}\nserver log:\n{log}",
                image.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ),
        }
    }

    /// Mount, or return the command's output and the server log.
    pub fn try_mount(
        image: &Path,
        mountpoint: &Path,
        options: &str,
    ) -> Result<JextMount, (Output, String)> {
        JextMount::try_mount_with_env(image, mountpoint, options, &[])
    }

    /// `try_mount` with extra environment variables for the server.
    pub fn try_mount_with_env(
        image: &Path,
        mountpoint: &Path,
        options: &str,
        env: &[(&str, &str)],
    ) -> Result<JextMount, (Output, String)> {
        let serial = MOUNT_SERIAL.fetch_add(1, Ordering::Relaxed);
        let log = image.with_extension(format!("jext4-{serial}.log"));
        JextMount::try_mount_logged_with_env(image, mountpoint, options, log, env)
    }

    /// Mount with the server's log in `log` (for images named by an NBD
    /// URI, whose name says nothing about a directory to log in).
    pub fn try_mount_logged(
        image: &Path,
        mountpoint: &Path,
        options: &str,
        log: PathBuf,
    ) -> Result<JextMount, (Output, String)> {
        JextMount::try_mount_logged_with_env(image, mountpoint, options, log, &[])
    }

    fn try_mount_logged_with_env(
        image: &Path,
        mountpoint: &Path,
        options: &str,
        log: PathBuf,
        env: &[(&str, &str)],
    ) -> Result<JextMount, (Output, String)> {
        fs::create_dir_all(mountpoint).expect("creating the mount point");
        let mut command = Command::new(JEXT4);
        command.envs(env.iter().copied());
        command.arg("mount").arg("--log").arg(&log);
        if !options.is_empty() {
            command.args(["-o", options]);
        }
        let output = command
            .arg(image)
            .arg(mountpoint)
            .output()
            .expect("running jext4 mount");
        if !output.status.success() {
            let text = fs::read_to_string(&log).unwrap_or_default();
            return Err((output, text));
        }
        assert!(
            is_mount_point(mountpoint),
            "jext4 mount returned success but {} is not a mount point",
            mountpoint.display()
        );
        Ok(JextMount {
            image: image.to_path_buf(),
            mountpoint: mountpoint.to_path_buf(),
            log,
            mount_stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            mounted: true,
        })
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.mountpoint.join(relative)
    }

    /// The server's pid, from the runtime file it writes once mounted.
    pub fn server_pid(&self) -> i32 {
        let mountpoint = self.mountpoint.canonicalize().expect("the mount point");
        jext4::engine::fuse::serve::ServerRecord::read(&mountpoint)
            .unwrap_or_else(|| panic!("no server record for {}", mountpoint.display()))
            .pid
    }

    pub fn server_log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `jext4 umount`, which must succeed and leave no mount behind.
    pub fn unmount(mut self) {
        self.mounted = false;
        let output = Command::new(JEXT4)
            .args(["umount", "--timeout", "120"])
            .arg(&self.mountpoint)
            .output()
            .expect("running jext4 umount");
        let still_mounted = is_mount_point(&self.mountpoint);
        if !output.status.success() || still_mounted {
            force_fuse_unmount(&self.mountpoint);
            panic!(
                "jext4 umount {} failed ({}): {}\nserver log:\n{}",
                self.mountpoint.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr),
                self.server_log()
            );
        }
        let log = self.server_log();
        assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    }

    /// Mark as unmounted by someone else (e.g. `fusermount3 -u`).
    pub fn forget(mut self) {
        self.mounted = false;
    }
}

impl Drop for JextMount {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        let _ = Command::new(JEXT4)
            .args(["umount", "--timeout", "60"])
            .arg(&self.mountpoint)
            .output();
        if is_mount_point(&self.mountpoint) {
            force_fuse_unmount(&self.mountpoint);
        }
        eprintln!(
            "jext4 server log ({}):\n{}",
            self.log.display(),
            self.server_log()
        );
    }
}

fn force_fuse_unmount(mountpoint: &Path) {
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(mountpoint)
        .output();
    if is_mount_point(mountpoint) {
        let _ = Command::new("umount").arg("-l").arg(mountpoint).output();
    }
}

/// A kernel ext4 loop mount. Dropping it unmounts and detaches the loop
/// device.
pub struct KernelMount {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    mounted: bool,
}

impl KernelMount {
    /// `mount -t ext4 -o loop[,ro]`: the ext4 driver reads ext2 and ext3 too,
    /// with nanosecond timestamps where the inodes have room for them.
    pub fn mount(image: &Path, mountpoint: &Path, read_only: bool) -> KernelMount {
        KernelMount::mount_with(image, mountpoint, if read_only { "ro" } else { "" })
    }

    /// The same with mount `options` besides `loop`.
    pub fn mount_with(image: &Path, mountpoint: &Path, options: &str) -> KernelMount {
        KernelMount::try_mount_with(image, mountpoint, options).unwrap_or_else(|refused| {
            panic!(
                "mount -o loop,{options} {} failed ({}):\n{}{}",
                image.display(),
                refused.status,
                String::from_utf8_lossy(&refused.stdout),
                String::from_utf8_lossy(&refused.stderr)
            )
        })
    }

    /// `mount_with`, where the kernel may refuse: then its output, and no
    /// loop device left bound to the image.
    pub fn try_mount_with(
        image: &Path,
        mountpoint: &Path,
        options: &str,
    ) -> Result<KernelMount, Output> {
        fs::create_dir_all(mountpoint).expect("creating the mount point");
        let options = if options.is_empty() {
            "loop".to_string()
        } else {
            format!("loop,{options}")
        };
        let output = run(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                &options,
                path_str(image),
                path_str(mountpoint),
            ],
        );
        if !output.status.success() {
            detach_loops(image);
            return Err(output);
        }
        Ok(KernelMount {
            image: image.to_path_buf(),
            mountpoint: mountpoint.to_path_buf(),
            mounted: true,
        })
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.mountpoint.join(relative)
    }

    pub fn unmount(mut self) {
        self.mounted = false;
        crate::common::kernel_umount(&self.mountpoint);
        detach_loops(&self.image);
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        if run("umount", &[path_str(&self.mountpoint)])
            .status
            .success()
        {
            detach_loops(&self.image);
            return;
        }
        let _ = run("umount", &["-l", path_str(&self.mountpoint)]);
        detach_loops(&self.image);
    }
}

/// Detach every loop device still bound to `image` (a mount made with
/// `-o loop` normally frees its device itself).
pub fn detach_loops(image: &Path) {
    let output = run("losetup", &["-j", path_str(image)]);
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        if let Some((device, _)) = line.split_once(':') {
            let _ = run("losetup", &["-d", device]);
        }
    }
}
