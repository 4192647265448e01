//! `jext4 tar -x|-c [-f ARCHIVE|-] IMAGE:PATH`: a tar archive into an image
//! or out of one (`jext4::engine::tools::unpack`, `pack`), members relative to
//! PATH as with `tar -C PATH`.

use super::tools::{ImageArgs, Session, display, owner, with_progress};
use clap::Args;
use jext4::engine::tools::{CopyOptions, Progress};
use std::io::Write;

#[derive(Args, Debug)]
pub struct TarArgs {
    /// Extract the archive into the image directory.
    #[arg(short = 'x', long = "extract", conflicts_with = "create")]
    pub extract: bool,
    /// Create an archive of the image directory.
    #[arg(short = 'c', long = "create")]
    pub create: bool,
    /// The archive; `-` (the default) is standard input or output.
    /// Compression is recognised when extracting (gzip, xz, zstd).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "ARCHIVE",
        default_value = "-"
    )]
    pub file: String,
    /// Compress the archive created with gzip.
    #[arg(short = 'z', long = "gzip")]
    pub gzip: bool,
    /// Compress the archive created with xz.
    #[arg(short = 'J', long = "xz", conflicts_with = "gzip")]
    pub xz: bool,
    /// Compress the archive created with zstd.
    #[arg(long = "zstd", conflicts_with_all = ["gzip", "xz"])]
    pub zstd: bool,
    /// List the members as they are done.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Extracted members belong to the caller, not to the archive's owners
    /// (which are kept by default, whoever runs it).
    #[arg(long = "no-same-owner")]
    pub no_same_owner: bool,
    /// Give every extracted member this owner (numbers).
    #[arg(long, value_name = "UID:GID", value_parser = owner)]
    pub owner: Option<(u32, u32)>,
    /// No extracted time later than this (seconds since the epoch);
    /// SOURCE_DATE_EPOCH when not given.
    #[arg(long, value_name = "SECONDS")]
    pub mtime: Option<i64>,
    /// The image directory to extract into or archive.
    #[arg(value_name = "IMAGE:PATH")]
    pub path: String,
    #[command(flatten)]
    pub common: ImageArgs,
}

pub fn tar(session: &mut Session, args: &TarArgs) -> u8 {
    let label = session.label.clone();
    let say = |message: String| eprintln!("{label}tar: {message}");
    if !args.extract && !args.create {
        say("one of -x and -c is required".into());
        return 1;
    }
    let Some(path) = session.image_path(&args.path) else {
        say(format!("'{}': not an IMAGE:PATH", args.path));
        return 1;
    };
    let image = match session.image(&path.image) {
        Ok(image) => image,
        Err(message) => {
            say(message);
            return 1;
        }
    };
    let mut progress = Progress::default();
    if args.verbose {
        progress.verbose = Some(Box::new(|member: &str, to: &str| match member {
            "" => eprintln!("{to}"),
            member => eprintln!("{member}"),
        }));
    }
    let result = match args.extract {
        true => {
            let options = CopyOptions {
                preserve: !args.no_same_owner,
                owner: args.owner,
                clamp_time: args.mtime.or_else(super::tools::source_date_epoch),
                ..CopyOptions::default()
            };
            // Read by a thread of its own (`unpack`).
            let input: Box<dyn std::io::Read + Send> = match args.file.as_str() {
                "-" => Box::new(std::io::stdin()),
                file => match std::fs::File::open(file) {
                    Ok(file) => Box::new(file),
                    Err(error) => {
                        say(format!(
                            "{file}: Cannot open: {}",
                            jext4::engine::tools::describe(&error.into())
                        ));
                        return 2;
                    }
                },
            };
            with_progress(&progress, || {
                jext4::engine::tools::unpack(image, input, path.trimmed(), &options, &progress)
            })
        }
        false => with_progress(&progress, || create(image, args, path.trimmed(), &progress)),
    };
    match result {
        Ok(report) => {
            for skipped in &report.skipped {
                say(skipped.to_string());
            }
            for what in &report.not_kept {
                say(format!("not kept: {what}"));
            }
            u8::from(!report.skipped.is_empty())
        }
        Err(failure) => {
            say(format!(
                "{}:{failure}",
                display(&path).split(':').next().unwrap_or("")
            ));
            2
        }
    }
}

/// The archive of `source`, compressed as asked, to the file or stdout.
fn create(
    image: &jext4::Image,
    args: &TarArgs,
    source: &str,
    progress: &Progress,
) -> Result<jext4::engine::tools::Report, jext4::engine::tools::Failure> {
    let failure = |error: std::io::Error| jext4::engine::tools::Failure {
        path: args.file.clone(),
        error: error.into(),
    };
    let output: Box<dyn Write> = match args.file.as_str() {
        "-" => Box::new(std::io::stdout().lock()),
        file => Box::new(std::fs::File::create(file).map_err(failure)?),
    };
    let output = std::io::BufWriter::with_capacity(1 << 20, output);
    if args.gzip {
        let mut encoder = flate2::write::GzEncoder::new(output, flate2::Compression::default());
        let report = jext4::engine::tools::pack(image, source, &mut encoder, progress)?;
        encoder
            .finish()
            .and_then(|mut w| w.flush())
            .map_err(failure)?;
        Ok(report)
    } else if args.xz {
        let mut encoder = xz2::write::XzEncoder::new(output, 6);
        let report = jext4::engine::tools::pack(image, source, &mut encoder, progress)?;
        encoder
            .finish()
            .and_then(|mut w| w.flush())
            .map_err(failure)?;
        Ok(report)
    } else if args.zstd {
        let mut encoder = zstd::stream::write::Encoder::new(output, 0).map_err(failure)?;
        let report = jext4::engine::tools::pack(image, source, &mut encoder, progress)?;
        encoder
            .finish()
            .and_then(|mut w| w.flush())
            .map_err(failure)?;
        Ok(report)
    } else {
        let mut output = output;
        let report = jext4::engine::tools::pack(image, source, &mut output, progress)?;
        output.flush().map_err(failure)?;
        Ok(report)
    }
}
