//! Blurt: the load generator of the Tux3 out-of-space post (Daniel Phillips,
//! 2015), and the shell loop the post runs it in:
//!
//! ```text
//! for ((j=1;j<10;j++)); do for ((i=1;i<10;i++)); do
//!     mkdir -p fs/$i && blurt fs/$i/f 40 1000 || break 2; done; done
//! ```
//!
//! Each step forks `tasks` processes; each creates (`creat`, so truncating
//! the file of an earlier pass) `DIR/<i>/f<task>` and writes it `chunk`
//! bytes at a time, `writes` times, without fsync. The outer passes rewrite
//! the same files, which is what tests out-of-space accounting: the space of
//! a truncated file comes back only when its truncation commits. A step in
//! which any task fails ends the loop, as `|| break 2` does; ENOSPC there is
//! the expected end on a small volume, any other errno is a failure.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

use crate::common::{at, emit, syncfs};
use crate::smallwriters::{spawn_all, wait_all};

/// The post's loop shape and task sizes.
pub struct Options {
    pub dir: PathBuf,
    pub passes: usize,
    pub directories: usize,
    pub writes: usize,
    pub tasks: usize,
    pub chunk_bytes: usize,
}

/// How one step (one blurt invocation) ended.
struct Step {
    enospc: usize,
    other_errors: Vec<i32>,
}

fn one_step(directory: &std::path::Path, options: &Options, text: &[u8]) -> io::Result<Step> {
    fs::create_dir_all(directory).map_err(at(directory))?;
    let paths: Vec<CString> = (0..options.tasks)
        .map(|task| {
            let path = directory.join(format!("f{task}"));
            CString::new(path.as_os_str().as_bytes()).expect("no NUL in paths")
        })
        .collect();
    let (release, pids) = spawn_all(&paths, text, options.writes)?;
    // SAFETY: closing the write end releases every task at once.
    unsafe { libc::close(release) };
    let failures = wait_all(&pids)?;
    let enospc = failures
        .iter()
        .filter(|&&errno| errno == libc::ENOSPC)
        .count();
    let other_errors = failures
        .into_iter()
        .filter(|&errno| errno != libc::ENOSPC)
        .collect();
    Ok(Step {
        enospc,
        other_errors,
    })
}

pub fn run(options: Options) -> io::Result<()> {
    // The post's text buffer: "hello world!\n" and zeros to the chunk size.
    let mut text = vec![0u8; options.chunk_bytes];
    let greeting = b"hello world!\n";
    let shown = greeting.len().min(options.chunk_bytes);
    text[..shown].copy_from_slice(&greeting[..shown]);
    let began = Instant::now();
    let mut steps_done = 0;
    let mut ended_at = None;
    let mut enospc_tasks = 0;
    let mut other_errors = Vec::new();
    'passes: for pass in 1..=options.passes {
        for index in 1..=options.directories {
            let step = one_step(&options.dir.join(index.to_string()), &options, &text)?;
            if step.enospc > 0 || !step.other_errors.is_empty() {
                ended_at = Some(format!("{pass}:{index}"));
                enospc_tasks = step.enospc;
                other_errors = step.other_errors;
                break 'passes;
            }
            steps_done += 1;
        }
    }
    let loop_seconds = began.elapsed().as_secs_f64();
    syncfs(&options.dir)?;
    let seconds = began.elapsed().as_secs_f64();
    if !other_errors.is_empty() {
        let errors: Vec<String> = other_errors
            .iter()
            .map(|&errno| io::Error::from_raw_os_error(errno).to_string())
            .collect();
        return Err(io::Error::other(format!(
            "blurt step {}: {} task(s) failed with errors other than ENOSPC: {}",
            ended_at.unwrap_or_default(),
            errors.len(),
            errors.join("; ")
        )));
    }
    emit(json!({
        "workload": "blurt",
        "tasks": options.tasks,
        "writes": options.writes,
        "steps_total": options.passes * options.directories,
        "steps_done": steps_done,
        "full_at_step": ended_at,
        "enospc_tasks": enospc_tasks,
        "loop_seconds": loop_seconds,
        "seconds": seconds,
    }));
    Ok(())
}
