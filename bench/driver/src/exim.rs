//! Mail spool: the Exim pattern of the DJFS paper. Every thread is one Exim
//! delivery process; all share the spool (`input/`, `msglog/`), the mailboxes
//! (`mail/`) and the `mainlog`. One operation is one message, received and
//! delivered:
//!   1. receive: write the body to `input/<id>-D` and fsync it; write the
//!      header to a temporary `input/hdr.<thread>`, fsync, rename it to
//!      `input/<id>-H` (Exim's order: the -H file's appearance commits the message);
//!   2. deliver: write `msglog/<id>`, append the message to one of the mailboxes
//!      and fsync it, append a line to `mainlog`;
//!   3. retire: unlink `msglog/<id>`, `input/<id>-H`, `input/<id>-D`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use serde_json::json;

use crate::common::{Rng, at, emit, pattern, run_threads};

const MAILBOXES: u64 = 100;
const HEADER_BYTES: usize = 1024;

struct Spool {
    input: PathBuf,
    msglog: PathBuf,
    mail: PathBuf,
    mainlog: PathBuf,
}

fn write_synced(path: &Path, data: &[u8]) -> io::Result<()> {
    let mut file = File::create(path).map_err(at(path))?;
    file.write_all(data).map_err(at(path))?;
    file.sync_all().map_err(at(path))
}

fn append(path: &Path, data: &[u8], sync: bool) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(at(path))?;
    file.write_all(data).map_err(at(path))?;
    if sync {
        file.sync_all().map_err(at(path))?;
    }
    Ok(())
}

fn message(spool: &Spool, id: &str, thread: usize, rng: &mut Rng, body: &[u8]) -> io::Result<()> {
    let data = spool.input.join(format!("{id}-D"));
    let header = spool.input.join(format!("{id}-H"));
    let temporary = spool.input.join(format!("hdr.{thread}"));
    let msglog = spool.msglog.join(id);
    write_synced(&data, body)?;
    write_synced(&temporary, &body[..HEADER_BYTES])?;
    fs::rename(&temporary, &header).map_err(at(&header))?;

    fs::write(&msglog, format!("{id} delivering\n")).map_err(at(&msglog))?;
    let mailbox = spool.mail.join(format!("user{}", rng.below(MAILBOXES)));
    append(&mailbox, body, true)?;
    append(
        &spool.mainlog,
        format!("{id} => delivered\n").as_bytes(),
        false,
    )?;

    for path in [&msglog, &header, &data] {
        fs::remove_file(path).map_err(at(path))?;
    }
    Ok(())
}

pub fn run(
    dir: PathBuf,
    threads: usize,
    seconds: f64,
    message_bytes: usize,
    seed: u64,
) -> io::Result<()> {
    assert!(
        message_bytes >= HEADER_BYTES,
        "a message holds at least its header"
    );
    let spool = Spool {
        input: dir.join("input"),
        msglog: dir.join("msglog"),
        mail: dir.join("mail"),
        mainlog: dir.join("mainlog"),
    };
    for path in [&spool.input, &spool.msglog, &spool.mail] {
        fs::create_dir_all(path).map_err(at(path))?;
    }
    let body = pattern(message_bytes, 5);
    let result = run_threads(threads, seconds, move |index, stop| {
        let mut rng = Rng::new(seed ^ ((index as u64 + 1) << 32));
        let mut count = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let id = format!("{index:03}-{count:08}");
            message(&spool, &id, index, &mut rng, &body)?;
            count += 1;
        }
        Ok(count)
    })?;
    emit(json!({
        "workload": "exim",
        "threads": threads,
        "message_bytes": message_bytes,
        "operations": result.operations,
        "seconds": result.seconds,
        "ops_per_sec": result.per_second(),
    }));
    Ok(())
}
