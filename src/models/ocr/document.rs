//! One page, one answer: layout regions with their text lines, in reading
//! order, and the page as Markdown or plain text.
//!
//! Each line goes to the smallest region that holds at least half of its
//! box; lines in no region become regions of their own
//! (class "text", no score). Regions are read in columns: a region wider
//! than 60% of the page spans the columns and separates bands; within a
//! band the left column is read top to bottom, then the right one. Lines
//! keep RapidOCR's order inside a region (top to bottom, left to right).

use super::TextLine;

/// A region as the layout model found it (page pixels).
#[derive(Clone, Debug, PartialEq)]
pub struct Region {
    pub class: String,
    /// None for a region made from lines outside every detected one.
    pub score: Option<f32>,
    pub bounds: [f64; 4],
    /// Indices into the page's lines, in reading order.
    pub lines: Vec<usize>,
}

/// A page read: regions in reading order and every line.
#[derive(Clone, Debug, PartialEq)]
pub struct Page {
    pub width: usize,
    pub height: usize,
    pub regions: Vec<Region>,
    pub lines: Vec<TextLine>,
}

fn overlap(a: [f64; 4], b: [f64; 4]) -> f64 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    w * h
}

fn area(a: [f64; 4]) -> f64 {
    (a[2] - a[0]).max(0.0) * (a[3] - a[1]).max(0.0)
}

impl Page {
    /// Assembles a page from layout regions (class, score, bounds) and the
    /// recognised lines.
    pub fn assemble(
        width: usize,
        height: usize,
        layout: Vec<(String, f32, [f64; 4])>,
        lines: Vec<TextLine>,
    ) -> Page {
        let mut regions: Vec<Region> = layout
            .into_iter()
            .map(|(class, score, bounds)| Region {
                class,
                score: Some(score),
                bounds,
                lines: Vec::new(),
            })
            .collect();
        for (i, line) in lines.iter().enumerate() {
            let b = line.bounds();
            // The smallest region holding at least half of the line:
            // regions can overlap or nest, and the tighter one is meant.
            let best = regions
                .iter()
                .enumerate()
                .filter(|(_, r)| {
                    let o = overlap(b, r.bounds);
                    o > 0.0 && o >= 0.5 * area(b)
                })
                .min_by(|x, y| area(x.1.bounds).total_cmp(&area(y.1.bounds)))
                .map(|(k, _)| k);
            match best {
                Some(k) => regions[k].lines.push(i),
                _ => regions.push(Region {
                    class: "text".into(),
                    score: None,
                    bounds: b,
                    lines: vec![i],
                }),
            }
        }
        let order = reading_order(&regions, width as f64);
        let regions = order.into_iter().map(|k| regions[k].clone()).collect();
        Page {
            width,
            height,
            regions,
            lines,
        }
    }

    /// A region's text: its lines joined with spaces, a hyphen at a line's
    /// end joined to the next word.
    pub fn region_text(&self, r: &Region) -> String {
        join_lines(r.lines.iter().map(|&i| self.lines[i].text.as_str()))
    }

    /// The page's text: regions one per paragraph, lines joined.
    pub fn text(&self) -> String {
        let mut out = Vec::new();
        for r in &self.regions {
            let t = self.region_text(r);
            if !t.is_empty() {
                out.push(t);
            }
        }
        out.join("\n\n")
    }

    /// The page as Markdown: titles as headings, paragraphs, captions in
    /// italics, equations as display math, tables with one row per line
    /// band and one cell per line, figures marked (with any text in them),
    /// page headers and footers left out.
    pub fn markdown(&self) -> String {
        let mut out: Vec<String> = Vec::new();
        for r in &self.regions {
            let text = self.region_text(r);
            let block = match r.class.as_str() {
                "header" | "footer" => continue,
                "title" if !text.is_empty() => format!("## {text}"),
                "figure" => {
                    if text.is_empty() {
                        "*[figure]*".to_string()
                    } else {
                        format!("*[figure: {text}]*")
                    }
                }
                "figure_caption" | "table_caption" if !text.is_empty() => format!("*{text}*"),
                "equation" if !text.is_empty() => format!("$$\n{text}\n$$"),
                "table" => self.table(r),
                _ if text.is_empty() => continue,
                _ => text,
            };
            out.push(block);
        }
        let mut md = out.join("\n\n");
        md.push('\n');
        md
    }

    /// A table region: lines grouped into rows by vertical overlap, cells
    /// left to right.
    fn table(&self, r: &Region) -> String {
        let mut rows: Vec<(f64, f64, Vec<usize>)> = Vec::new();
        let mut idx = r.lines.clone();
        idx.sort_by(|&a, &b| self.lines[a].bounds()[1].total_cmp(&self.lines[b].bounds()[1]));
        for i in idx {
            let b = self.lines[i].bounds();
            let mid = (b[1] + b[3]) / 2.0;
            match rows.iter_mut().find(|(y0, y1, _)| mid >= *y0 && mid <= *y1) {
                Some(row) => row.2.push(i),
                None => rows.push((b[1], b[3], vec![i])),
            }
        }
        if rows.is_empty() {
            return "*[table]*".to_string();
        }
        let cols = rows.iter().map(|r| r.2.len()).max().unwrap_or(1);
        let mut out = Vec::new();
        for (k, (_, _, cells)) in rows.iter_mut().enumerate() {
            cells.sort_by(|&a, &b| self.lines[a].bounds()[0].total_cmp(&self.lines[b].bounds()[0]));
            let mut texts: Vec<String> = cells
                .iter()
                .map(|&i| self.lines[i].text.replace('|', "\\|"))
                .collect();
            texts.resize(cols, String::new());
            out.push(format!("| {} |", texts.join(" | ")));
            if k == 0 {
                out.push(format!("|{}", " --- |".repeat(cols)));
            }
        }
        out.join("\n")
    }
}

/// Lines joined with spaces; a line ending in a hyphen after a letter runs
/// on into the next.
pub fn join_lines<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    let mut out = String::new();
    for line in lines {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if !out.is_empty() {
            let hyphenated = out.ends_with('-')
                && out[..out.len() - 1]
                    .chars()
                    .last()
                    .is_some_and(char::is_alphabetic)
                && line.chars().next().is_some_and(char::is_lowercase);
            if hyphenated {
                out.pop();
            } else {
                out.push(' ');
            }
        }
        out.push_str(line);
    }
    out
}

/// Region indices in reading order (see the module docs).
pub fn reading_order(regions: &[Region], page_width: f64) -> Vec<usize> {
    let mid = page_width / 2.0;
    let spans = |r: &Region| r.bounds[2] - r.bounds[0] > 0.6 * page_width;
    let mut full: Vec<usize> = (0..regions.len()).filter(|&k| spans(&regions[k])).collect();
    full.sort_by(|&a, &b| regions[a].bounds[1].total_cmp(&regions[b].bounds[1]));
    let mut order = Vec::with_capacity(regions.len());
    let mut taken = vec![false; regions.len()];
    let top = |k: usize| regions[k].bounds[1];
    let centre = |k: usize| (regions[k].bounds[0] + regions[k].bounds[2]) / 2.0;
    // Bands between consecutive spanning regions.
    let mut bounds_y: Vec<f64> = full.iter().map(|&k| top(k)).collect();
    bounds_y.push(f64::INFINITY);
    let mut prev = f64::NEG_INFINITY;
    for (band, &limit) in bounds_y.iter().enumerate() {
        let mut cols: [Vec<usize>; 2] = [Vec::new(), Vec::new()];
        for k in 0..regions.len() {
            if !taken[k] && !spans(&regions[k]) && top(k) >= prev && top(k) < limit {
                cols[(centre(k) >= mid) as usize].push(k);
            }
        }
        for col in &mut cols {
            col.sort_by(|&a, &b| top(a).total_cmp(&top(b)));
            for &k in col.iter() {
                taken[k] = true;
                order.push(k);
            }
        }
        if let Some(&k) = full.get(band) {
            taken[k] = true;
            order.push(k);
        }
        prev = limit;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str, b: [f64; 4]) -> TextLine {
        TextLine {
            corners: [[b[0], b[1]], [b[2], b[1]], [b[2], b[3]], [b[0], b[3]]],
            text: text.into(),
            score: 0.9,
        }
    }

    #[test]
    fn columns_then_top_to_bottom() {
        let layout = vec![
            ("text".to_string(), 0.9, [520.0, 100.0, 950.0, 300.0]),
            ("title".to_string(), 0.9, [50.0, 10.0, 950.0, 60.0]),
            ("text".to_string(), 0.9, [50.0, 100.0, 480.0, 300.0]),
        ];
        let lines = vec![
            line("A Title", [60.0, 20.0, 400.0, 50.0]),
            line("left one, hyph-", [60.0, 110.0, 470.0, 130.0]),
            line("enated", [60.0, 140.0, 200.0, 160.0]),
            line("right", [530.0, 110.0, 900.0, 130.0]),
            line("stray", [400.0, 900.0, 600.0, 930.0]),
        ];
        let page = Page::assemble(1000, 1000, layout, lines);
        let classes: Vec<&str> = page.regions.iter().map(|r| r.class.as_str()).collect();
        assert_eq!(classes, ["title", "text", "text", "text"]);
        assert_eq!(
            page.text(),
            "A Title\n\nleft one, hyphenated\n\nright\n\nstray"
        );
        assert_eq!(
            page.markdown(),
            "## A Title\n\nleft one, hyphenated\n\nright\n\nstray\n"
        );
        assert!(page.regions[3].score.is_none());
    }
}
