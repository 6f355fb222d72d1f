//! The plane geometry of RapidOCR's detection post-processing and line
//! cropping, reproduced from what OpenCV and pyclipper compute:
//! region borders of a binary map (OpenCV `findContours`, as point sets),
//! convex hulls and minimum-area rectangles (`minAreaRect`, `boxPoints`),
//! the rounded offset of a polygon (pyclipper's `ClipperOffset` with round
//! joins), polygon masks (`fillPoly`), and the perspective crop of a line
//! (`getPerspectiveTransform` + `warpPerspective` with OpenCV's fixed-point
//! bicubic filter and replicated borders).

/// A point in pixel coordinates (x right, y down).
pub type Point = [f64; 2];

/// The point sets of the region borders of `mask` ([h, w], non-zero is
/// foreground), as `findContours(RETR_LIST)` finds them: one per
/// 8-connected foreground component (its pixels), then one per hole (a
/// 4-connected background component not touching the image edge: the
/// foreground pixels beside it). Only what a border's convex hull needs is
/// kept, so each set is the pixels at the ends of every row run.
pub fn region_borders(mask: &[u8], w: usize, h: usize) -> Vec<Vec<Point>> {
    assert_eq!(mask.len(), w * h, "region_borders: mask is not [h, w]");
    let mut borders = Vec::new();
    let mut label = vec![u32::MAX; w * h];
    let mut stack = Vec::new();
    // Foreground components, 8-connected.
    for start in 0..w * h {
        if mask[start] == 0 || label[start] != u32::MAX {
            continue;
        }
        let id = borders.len() as u32;
        label[start] = id;
        stack.push(start);
        let mut rows: std::collections::BTreeMap<usize, (usize, usize)> = Default::default();
        while let Some(p) = stack.pop() {
            let (x, y) = (p % w, p / w);
            let e = rows.entry(y).or_insert((x, x));
            e.0 = e.0.min(x);
            e.1 = e.1.max(x);
            for dy in -1i64..=1 {
                for dx in -1i64..=1 {
                    let (nx, ny) = (x as i64 + dx, y as i64 + dy);
                    if nx < 0 || ny < 0 || nx >= w as i64 || ny >= h as i64 {
                        continue;
                    }
                    let q = ny as usize * w + nx as usize;
                    if mask[q] != 0 && label[q] == u32::MAX {
                        label[q] = id;
                        stack.push(q);
                    }
                }
            }
        }
        borders.push(run_ends(&rows));
    }
    // Holes: background components, 4-connected, away from the edge.
    let mut seen = vec![false; w * h];
    for start in 0..w * h {
        if mask[start] != 0 || seen[start] {
            continue;
        }
        seen[start] = true;
        stack.push(start);
        let mut touches_edge = false;
        let mut rows: std::collections::BTreeMap<usize, (usize, usize)> = Default::default();
        while let Some(p) = stack.pop() {
            let (x, y) = (p % w, p / w);
            if x == 0 || y == 0 || x == w - 1 || y == h - 1 {
                touches_edge = true;
            }
            for (dx, dy) in [(-1i64, 0i64), (1, 0), (0, -1), (0, 1)] {
                let (nx, ny) = (x as i64 + dx, y as i64 + dy);
                if nx < 0 || ny < 0 || nx >= w as i64 || ny >= h as i64 {
                    continue;
                }
                let q = ny as usize * w + nx as usize;
                if mask[q] != 0 {
                    let e = rows
                        .entry(ny as usize)
                        .or_insert((nx as usize, nx as usize));
                    e.0 = e.0.min(nx as usize);
                    e.1 = e.1.max(nx as usize);
                } else if !seen[q] {
                    seen[q] = true;
                    stack.push(q);
                }
            }
        }
        if !touches_edge && !rows.is_empty() {
            borders.push(run_ends(&rows));
        }
    }
    borders
}

fn run_ends(rows: &std::collections::BTreeMap<usize, (usize, usize)>) -> Vec<Point> {
    let mut pts = Vec::with_capacity(rows.len() * 2);
    for (&y, &(a, b)) in rows {
        pts.push([a as f64, y as f64]);
        if b != a {
            pts.push([b as f64, y as f64]);
        }
    }
    pts
}

fn cross(o: Point, a: Point, b: Point) -> f64 {
    (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])
}

/// The convex hull of `pts`, counter-clockwise in a y-up frame (monotone
/// chain), without collinear points.
pub fn convex_hull(pts: &[Point]) -> Vec<Point> {
    let mut p: Vec<Point> = pts.to_vec();
    p.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    p.dedup();
    if p.len() < 3 {
        return p;
    }
    let mut hull: Vec<Point> = Vec::with_capacity(p.len() * 2);
    for pass in 0..2 {
        let start = hull.len();
        let iter: Box<dyn Iterator<Item = &Point>> = if pass == 0 {
            Box::new(p.iter())
        } else {
            Box::new(p.iter().rev())
        };
        for &q in iter {
            while hull.len() >= start + 2
                && cross(hull[hull.len() - 2], hull[hull.len() - 1], q) <= 0.0
            {
                hull.pop();
            }
            hull.push(q);
        }
        hull.pop();
    }
    hull
}

/// The order of the points handed to [`mini_box`], which decides where
/// OpenCV's convex hull of them starts (and so, in a few ties, which of
/// equal rectangles the rotating calipers keep).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PointOrder {
    /// A region border as `findContours` traces it, from its top-left
    /// pixel: the hull ends at that vertex.
    Contour,
    /// A polygon's vertices in their order (pyclipper's output): OpenCV
    /// turns the hull to start at the vertex that comes first in the
    /// input's order when the hull follows it (last when it runs against
    /// it), else at the largest point.
    Polygon,
}

/// OpenCV's `convexHull(points, clockwise=false)` as float32 vertices, in
/// its order: positive turns, starting where [`PointOrder`] says.
fn cv_hull(pts: &[Point], order: PointOrder) -> Vec<[f32; 2]> {
    let mut h = convex_hull(pts);
    if h.len() == 2 {
        h.reverse(); // the largest point first, as Sklansky's scan gives it
    }
    let n = h.len();
    if n >= 3 {
        let start = match order {
            PointOrder::Contour => {
                let top_left = (0..n)
                    .min_by(|&i, &j| {
                        (h[i][1], h[i][0])
                            .partial_cmp(&(h[j][1], h[j][0]))
                            .unwrap_or(std::cmp::Ordering::Equal)
                    })
                    .expect("a hull of three or more");
                (top_left + 1) % n
            }
            PointOrder::Polygon => {
                let idx: Vec<usize> = h
                    .iter()
                    .map(|v| {
                        pts.iter()
                            .position(|p| p == v)
                            .expect("a hull vertex is a point")
                    })
                    .collect();
                let lo = (0..n).min_by_key(|&i| idx[i]).expect("vertices");
                let hi = (0..n).max_by_key(|&i| idx[i]).expect("vertices");
                let rising = (0..n).all(|j| j == hi || idx[(j + 1) % n] > idx[j]);
                let falling = (0..n).all(|j| j == lo || idx[(j + 1) % n] < idx[j]);
                if rising {
                    lo
                } else if falling {
                    hi
                } else {
                    // Where Sklansky's scan starts: the largest point (x, then y).
                    (0..n)
                        .max_by(|&i, &j| {
                            h[i].partial_cmp(&h[j]).unwrap_or(std::cmp::Ordering::Equal)
                        })
                        .expect("vertices")
                }
            }
        };
        h.rotate_left(start);
    }
    h.iter().map(|p| [p[0] as f32, p[1] as f32]).collect()
}

/// A rotated rectangle as OpenCV's `minAreaRect` returns it: centre,
/// size (width, height) and angle in degrees, in [-90, 0), all float32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RotatedRect {
    pub center: [f32; 2],
    pub size: [f32; 2],
    pub angle: f32,
}

/// OpenCV 5's rotating calipers over a hull in [`cv_hull`]'s order, step
/// for step in float32 (the last of equal areas wins): a corner and the
/// rectangle's two side vectors.
fn rotating_calipers(p: &[[f32; 2]]) -> [[f32; 2]; 3] {
    let n = p.len();
    let mut vect = vec![[0f32; 2]; n];
    let mut inv_len = vec![0f32; n];
    let (mut left, mut bottom, mut right, mut top) = (0, 0, 0, 0);
    let mut pt0 = p[0];
    let (mut left_x, mut right_x, mut top_y, mut bottom_y) = (pt0[0], pt0[0], pt0[1], pt0[1]);
    for i in 0..n {
        if pt0[0] < left_x {
            (left_x, left) = (pt0[0], i);
        }
        if pt0[0] > right_x {
            (right_x, right) = (pt0[0], i);
        }
        if pt0[1] > top_y {
            (top_y, top) = (pt0[1], i);
        }
        if pt0[1] < bottom_y {
            (bottom_y, bottom) = (pt0[1], i);
        }
        let pt = p[(i + 1) % n];
        let (dx, dy) = (pt[0] as f64 - pt0[0] as f64, pt[1] as f64 - pt0[1] as f64);
        vect[i] = [dx as f32, dy as f32];
        inv_len[i] = (1.0 / (dx * dx + dy * dy).sqrt()) as f32;
        pt0 = pt;
    }
    let mut seq = [bottom, right, top, left];
    let mut min_area = f32::MAX;
    let mut best = (0usize, 0f32, 0f32, 0f32, 0f32, 0usize);
    for _ in 0..n {
        let v = |i: usize| vect[seq[i]];
        let rot = [
            v(0),
            [v(1)[1], -v(1)[0]],
            [-v(2)[0], -v(2)[1]],
            [-v(3)[1], v(3)[0]],
        ];
        let mut main = 0;
        for i in 1..4 {
            // rot[i] turned clockwise, against rot[main]: rot[i] is to the right.
            let t = [rot[i][1], -rot[i][0]];
            if t[0] * rot[main][0] + t[1] * rot[main][1] < 0.0 {
                main = i;
            }
        }
        let pi = seq[main];
        let (lx, ly) = (vect[pi][0] * inv_len[pi], vect[pi][1] * inv_len[pi]);
        let (base_a, base_b) = match main {
            0 => (lx, ly),
            1 => (ly, -lx),
            2 => (-lx, -ly),
            _ => (-ly, lx),
        };
        seq[main] = (seq[main] + 1) % n;
        let (dx, dy) = (p[seq[1]][0] - p[seq[3]][0], p[seq[1]][1] - p[seq[3]][1]);
        let width = dx * base_a + dy * base_b;
        let (dx, dy) = (p[seq[2]][0] - p[seq[0]][0], p[seq[2]][1] - p[seq[0]][1]);
        let height = -dx * base_b + dy * base_a;
        let area = width * height;
        if area <= min_area {
            min_area = area;
            best = (seq[3], base_a, width, base_b, height, seq[0]);
        }
    }
    let (s3, a1, width, b1, height, s0) = best;
    let (a2, b2) = (-b1, a1);
    let c1 = a1 * p[s3][0] + p[s3][1] * b1;
    let c2 = a2 * p[s0][0] + p[s0][1] * b2;
    let idet = 1.0f32 / (a1 * b2 - a2 * b1);
    let px = (c1 * b2 - c2 * b1) * idet;
    let py = (a1 * c2 - a2 * c1) * idet;
    [
        [px, py],
        [a1 * width, b1 * width],
        [a2 * height, b2 * height],
    ]
}

/// OpenCV 5's `minAreaRect` of `pts` (its hull started as `order` says),
/// to the bit; `None` for no points.
pub fn min_area_rect(pts: &[Point], order: PointOrder) -> Option<RotatedRect> {
    let h = cv_hull(pts, order);
    let mut angle = -std::f64::consts::FRAC_PI_2;
    let (center, size) = match h.len() {
        0 => return None,
        1 => (h[0], [0.0, 0.0]),
        2 => {
            let center = [(h[0][0] + h[1][0]) * 0.5, (h[0][1] + h[1][1]) * 0.5];
            let (dx, dy) = (
                h[0][0] as f64 - h[1][0] as f64,
                h[0][1] as f64 - h[1][1] as f64,
            );
            let mut size = [0.0, (dx * dx + dy * dy).sqrt() as f32];
            if dx == 0.0 {
                size.swap(0, 1);
            } else if dy < 0.0 {
                angle = dy.atan2(dx);
                size.swap(0, 1);
            } else if dy > 0.0 {
                angle = -dx.atan2(dy);
            }
            (center, size)
        }
        _ => {
            let [o0, o1, o2] = rotating_calipers(&h);
            let center = [o0[0] + (o1[0] + o2[0]) * 0.5, o0[1] + (o1[1] + o2[1]) * 0.5];
            let len = |v: [f32; 2]| ((v[0] as f64).powi(2) + (v[1] as f64).powi(2)).sqrt() as f32;
            let mut size = [len(o2), len(o1)];
            if o1[0] == 0.0 && o1[1] > 0.0 {
                size.swap(0, 1);
            } else {
                angle = -(o1[0] as f64).atan2(o1[1] as f64);
            }
            (center, size)
        }
    };
    Some(RotatedRect {
        center,
        size,
        angle: (angle * 180.0 / std::f64::consts::PI) as f32,
    })
}

/// OpenCV's `boxPoints` (`RotatedRect::points`), in float32.
pub fn box_points(r: &RotatedRect) -> [[f32; 2]; 4] {
    let angle = r.angle as f64 * std::f64::consts::PI / 180.0;
    let b = angle.cos() as f32 * 0.5;
    let a = angle.sin() as f32 * 0.5;
    let ([cx, cy], [w, h]) = (r.center, r.size);
    let (ah, aw, bh, bw) = (a * h, a * w, b * h, b * w);
    [
        [cx - ah - bw, cy + bh - aw],
        [cx + ah - bw, cy - bh - aw],
        [cx + ah + bw, cy - bh + aw],
        [cx - ah + bw, cy + bh + aw],
    ]
}

/// RapidOCR's `get_mini_boxes`: the minimum-area rectangle's corners (as
/// `boxPoints` gives them, float32) ordered top-left, top-right,
/// bottom-right, bottom-left by its sort on x then the two y tests, and
/// the rectangle's shorter side.
pub fn mini_box(pts: &[Point], order: PointOrder) -> Option<([Point; 4], f64)> {
    let r = min_area_rect(pts, order)?;
    let mut p: Vec<Point> = box_points(&r)
        .iter()
        .map(|c| [c[0] as f64, c[1] as f64])
        .collect();
    p.sort_by(|a, b| a[0].partial_cmp(&b[0]).unwrap_or(std::cmp::Ordering::Equal));
    let (i1, i4) = if p[1][1] > p[0][1] { (0, 1) } else { (1, 0) };
    let (i2, i3) = if p[3][1] > p[2][1] { (2, 3) } else { (3, 2) };
    Some((
        [p[i1], p[i2], p[i3], p[i4]],
        r.size[0].min(r.size[1]) as f64,
    ))
}

/// Shoelace area (absolute) and perimeter of a closed polygon.
pub fn area_and_perimeter(poly: &[Point]) -> (f64, f64) {
    let n = poly.len();
    let (mut area, mut len) = (0.0, 0.0);
    for i in 0..n {
        let (a, b) = (poly[i], poly[(i + 1) % n]);
        area += a[0] * b[1] - b[0] * a[1];
        len += ((b[0] - a[0]).powi(2) + (b[1] - a[1]).powi(2)).sqrt();
    }
    (area.abs() / 2.0, len)
}

/// Clipper's rounding: half away from zero.
fn clipper_round(v: f64) -> f64 {
    if v < 0.0 {
        (v - 0.5).trunc()
    } else {
        (v + 0.5).trunc()
    }
}

/// The polygon `poly` offset outwards by `delta` with round joins, as
/// pyclipper's `ClipperOffset` (arc tolerance 0.25) computes it: the input
/// coordinates truncated to integers, every output point rounded.
pub fn offset_round(poly: &[Point], delta: f64) -> Vec<Point> {
    let mut src: Vec<Point> = poly.iter().map(|p| [p[0].trunc(), p[1].trunc()]).collect();
    src.dedup();
    while src.len() > 1 && src.first() == src.last() {
        src.pop();
    }
    let n = src.len();
    if n < 3 || delta <= 0.0 {
        return src;
    }
    // Counter-clockwise in a y-up sense (positive shoelace) for outward
    // normals on the right of each edge, as Clipper orients it.
    let signed: f64 = (0..n)
        .map(|i| {
            let (a, b) = (src[i], src[(i + 1) % n]);
            a[0] * b[1] - b[0] * a[1]
        })
        .sum();
    if signed < 0.0 {
        src.reverse();
    }
    let normals: Vec<Point> = (0..n)
        .map(|i| {
            let (a, b) = (src[i], src[(i + 1) % n]);
            let (dx, dy) = (b[0] - a[0], b[1] - a[1]);
            let len = (dx * dx + dy * dy).sqrt();
            if len == 0.0 {
                [0.0, 0.0]
            } else {
                [dy / len, -dx / len]
            }
        })
        .collect();
    let arc_tolerance = 0.25;
    let y = (1.0 - arc_tolerance / delta).acos();
    let steps = std::f64::consts::PI / y;
    let (sin, cos) = (
        (2.0 * std::f64::consts::PI / steps).sin(),
        (2.0 * std::f64::consts::PI / steps).cos(),
    );
    let steps_per_rad = steps / (2.0 * std::f64::consts::PI);
    let mut out = Vec::new();
    for j in 0..n {
        let k = (j + n - 1) % n;
        let (nk, nj) = (normals[k], normals[j]);
        let sin_a = nk[0] * nj[1] - nj[0] * nk[1];
        let cos_a = nk[0] * nj[0] + nk[1] * nj[1];
        let p = src[j];
        if sin_a * delta < 0.0 {
            // A concave corner: no arc.
            out.push([
                clipper_round(p[0] + nk[0] * delta),
                clipper_round(p[1] + nk[1] * delta),
            ]);
            out.push(p);
            out.push([
                clipper_round(p[0] + nj[0] * delta),
                clipper_round(p[1] + nj[1] * delta),
            ]);
            continue;
        }
        let a = sin_a.atan2(cos_a);
        let count = (clipper_round(steps_per_rad * a.abs()) as i64).max(1);
        let (mut x, mut yv) = (nk[0], nk[1]);
        for _ in 0..count {
            out.push([
                clipper_round(p[0] + x * delta),
                clipper_round(p[1] + yv * delta),
            ]);
            let x2 = x;
            x = x * cos - sin * yv;
            yv = x2 * sin + yv * cos;
        }
        out.push([
            clipper_round(p[0] + nj[0] * delta),
            clipper_round(p[1] + nj[1] * delta),
        ]);
    }
    out
}

/// Whether the pixel (x, y) is covered when `cv2.fillPoly` fills the convex
/// polygon `poly` (integer vertices): inside or on its outline.
fn covered(poly: &[Point], x: f64, y: f64) -> bool {
    let n = poly.len();
    let (mut pos, mut neg) = (false, false);
    for i in 0..n {
        let c = cross(poly[i], poly[(i + 1) % n], [x, y]);
        // Half a pixel of slack: the outline itself is drawn.
        let len = ((poly[(i + 1) % n][0] - poly[i][0]).powi(2)
            + (poly[(i + 1) % n][1] - poly[i][1]).powi(2))
        .sqrt();
        if c > 0.5 * len {
            pos = true;
        } else if c < -0.5 * len {
            neg = true;
        }
    }
    !(pos && neg)
}

/// RapidOCR's `box_score_fast`: the mean of `prob` ([h, w]) over the box
/// filled as a polygon with its corners truncated to integers.
pub fn box_score(prob: &[f32], w: usize, h: usize, corners: &[Point; 4]) -> f64 {
    let xs = corners.iter().map(|p| p[0]);
    let ys = corners.iter().map(|p| p[1]);
    let clampi = |v: f64, n: usize| (v as i64).clamp(0, n as i64 - 1) as usize;
    let xmin = clampi(xs.clone().fold(f64::MAX, f64::min).floor(), w);
    let xmax = clampi(xs.fold(f64::MIN, f64::max).ceil(), w);
    let ymin = clampi(ys.clone().fold(f64::MAX, f64::min).floor(), h);
    let ymax = clampi(ys.fold(f64::MIN, f64::max).ceil(), h);
    let poly: Vec<Point> = corners
        .iter()
        .map(|p| [(p[0] - xmin as f64).trunc(), (p[1] - ymin as f64).trunc()])
        .collect();
    let (mut sum, mut count) = (0.0f64, 0usize);
    for y in ymin..=ymax {
        for x in xmin..=xmax {
            if covered(&poly, (x - xmin) as f64, (y - ymin) as f64) {
                sum += prob[y * w + x] as f64;
                count += 1;
            }
        }
    }
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}

/// The 3x3 homography taking `src` corners to `dst` corners (row-major,
/// m[8] = 1), by Gaussian elimination of the 8x8 system OpenCV solves.
pub fn perspective_transform(src: &[Point; 4], dst: &[Point; 4]) -> Option<[f64; 9]> {
    let mut a = [[0.0f64; 9]; 8];
    for i in 0..4 {
        let ([x, y], [u, v]) = (src[i], dst[i]);
        a[i] = [x, y, 1.0, 0.0, 0.0, 0.0, -x * u, -y * u, u];
        a[i + 4] = [0.0, 0.0, 0.0, x, y, 1.0, -x * v, -y * v, v];
    }
    for col in 0..8 {
        let pivot = (col..8).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-12 {
            return None;
        }
        a.swap(col, pivot);
        let p = a[col];
        for (row, r) in a.iter_mut().enumerate() {
            if row != col {
                let f = r[col] / p[col];
                for (v, q) in r.iter_mut().zip(&p).skip(col) {
                    *v -= f * q;
                }
            }
        }
    }
    let mut m = [0.0; 9];
    for i in 0..8 {
        m[i] = a[i][8] / a[i][i];
    }
    m[8] = 1.0;
    Some(m)
}

/// OpenCV's bicubic coefficients (A = -0.75) for a fraction `x`, in f32.
fn cubic_coeffs(x: f32) -> [f32; 4] {
    let a = -0.75f32;
    let c0 = ((a * (x + 1.0) - 5.0 * a) * (x + 1.0) + 8.0 * a) * (x + 1.0) - 4.0 * a;
    let c1 = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    let c2 = ((a + 2.0) * (1.0 - x) - (a + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0;
    [c0, c1, c2, 1.0 - c0 - c1 - c2]
}

/// Sub-pixel positions per pixel along each axis (OpenCV's INTER_TAB_SIZE).
const TAB: usize = 32;

/// OpenCV's 4x4 fixed-point bicubic weights for each of the 32 x 32
/// sub-pixel positions, each table summing to 2^15 exactly.
fn cubic_table() -> Vec<[i32; 16]> {
    let scale = 32768.0f32;
    let one_d: Vec<[f32; 4]> = (0..TAB)
        .map(|i| cubic_coeffs(i as f32 / TAB as f32))
        .collect();
    let mut tables = Vec::with_capacity(TAB * TAB);
    for ty in &one_d {
        for tx in &one_d {
            let mut t = [0i32; 16];
            let mut sum = 0;
            for i in 0..4 {
                for j in 0..4 {
                    let v = ty[i] * tx[j];
                    t[i * 4 + j] = ((v * scale).round_ties_even() as i32).clamp(-32768, 32767);
                    sum += t[i * 4 + j];
                }
            }
            if sum != 32768 {
                let diff = sum - 32768;
                let (mut mk, mut big) = (5usize, 5usize);
                for k1 in 1..3 {
                    for k2 in 1..3 {
                        let k = k1 * 4 + k2;
                        if t[k] < t[mk] {
                            mk = k;
                        } else if t[k] > t[big] {
                            big = k;
                        }
                    }
                }
                if diff < 0 {
                    t[big] -= diff;
                } else {
                    t[mk] -= diff;
                }
            }
            tables.push(t);
        }
    }
    tables
}

/// A 3-channel image [h, w, 3] in any channel order.
pub struct Planes<'a> {
    pub data: &'a [u8],
    pub width: usize,
    pub height: usize,
}

/// `cv2.warpPerspective(img, M, (dw, dh), INTER_CUBIC, BORDER_REPLICATE)`
/// with `m` mapping source to destination: each destination pixel reads
/// the source at M^-1 (x, y), quantised to 1/32 pixel, through the
/// fixed-point bicubic weights.
pub fn warp_perspective_cubic(
    img: &Planes<'_>,
    m: &[f64; 9],
    dw: usize,
    dh: usize,
) -> Option<Vec<u8>> {
    let inv = invert3(m)?;
    let table = cubic_table();
    let (w, h) = (img.width as i64, img.height as i64);
    let mut out = vec![0u8; dw * dh * 3];
    for y in 0..dh {
        let (x0, y0, w0) = (
            inv[1] * y as f64 + inv[2],
            inv[4] * y as f64 + inv[5],
            inv[7] * y as f64 + inv[8],
        );
        for x in 0..dw {
            let wv = w0 + inv[6] * x as f64;
            let wv = if wv != 0.0 { TAB as f64 / wv } else { 0.0 };
            let fx = ((x0 + inv[0] * x as f64) * wv).clamp(i32::MIN as f64, i32::MAX as f64);
            let fy = ((y0 + inv[3] * x as f64) * wv).clamp(i32::MIN as f64, i32::MAX as f64);
            let (ix, iy) = (fx.round_ties_even() as i64, fy.round_ties_even() as i64);
            let (sx, sy) = ((ix >> 5) - 1, (iy >> 5) - 1);
            let t = &table[((iy & 31) as usize) * TAB + (ix & 31) as usize];
            for c in 0..3 {
                let mut acc = 0i64;
                for i in 0..4 {
                    let yy = (sy + i as i64).clamp(0, h - 1) as usize;
                    for j in 0..4 {
                        let xx = (sx + j as i64).clamp(0, w - 1) as usize;
                        acc += img.data[(yy * img.width + xx) * 3 + c] as i64 * t[i * 4 + j] as i64;
                    }
                }
                out[(y * dw + x) * 3 + c] = ((acc + (1 << 14)) >> 15).clamp(0, 255) as u8;
            }
        }
    }
    Some(out)
}

fn invert3(m: &[f64; 9]) -> Option<[f64; 9]> {
    let det = m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6])
        + m[2] * (m[3] * m[7] - m[4] * m[6]);
    if det.abs() < 1e-15 {
        return None;
    }
    let d = 1.0 / det;
    Some([
        (m[4] * m[8] - m[5] * m[7]) * d,
        (m[2] * m[7] - m[1] * m[8]) * d,
        (m[1] * m[5] - m[2] * m[4]) * d,
        (m[5] * m[6] - m[3] * m[8]) * d,
        (m[0] * m[8] - m[2] * m[6]) * d,
        (m[2] * m[3] - m[0] * m[5]) * d,
        (m[3] * m[7] - m[4] * m[6]) * d,
        (m[1] * m[6] - m[0] * m[7]) * d,
        (m[0] * m[4] - m[1] * m[3]) * d,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borders_hulls_and_rectangles() {
        // A 4x3 block with a one-pixel hole, and a separate pixel.
        let (w, h) = (8, 5);
        let mut mask = vec![0u8; w * h];
        for y in 1..4 {
            for x in 1..5 {
                mask[y * w + x] = 1;
            }
        }
        mask[2 * w + 2] = 0;
        mask[7] = 1;
        let borders = region_borders(&mask, w, h);
        assert_eq!(borders.len(), 3, "{borders:?}");
        // Raster order: the lone pixel first, then the block, then its hole.
        let r = min_area_rect(&borders[1], PointOrder::Contour).unwrap();
        assert_eq!((r.size[0] * r.size[1]).round(), 3.0 * 2.0);
        let hole = min_area_rect(&borders[2], PointOrder::Contour).unwrap();
        // The four pixels beside a one-pixel hole: a diamond.
        assert!((hole.size[0] * hole.size[1] - 2.0).abs() < 1e-5);
        let (corners, short) = mini_box(&borders[0], PointOrder::Contour).unwrap();
        assert_eq!(short, 0.0);
        assert_eq!(corners[0], [7.0, 0.0]);
    }

    #[test]
    fn round_offset_of_a_rectangle_grows_each_side() {
        let rect = [[10.0, 10.0], [50.0, 10.0], [50.0, 20.0], [10.0, 20.0]];
        let out = offset_round(&rect, 3.0);
        let (corners, short) = mini_box(&out, PointOrder::Polygon).unwrap();
        assert_eq!(short, 16.0);
        assert_eq!(corners[0], [7.0, 7.0]);
        assert_eq!(corners[2], [53.0, 23.0]);
    }

    fn pixels(p: &[[i32; 2]]) -> Vec<Point> {
        p.iter().map(|&[x, y]| [x as f64, y as f64]).collect()
    }

    /// cv2 5.0's `minAreaRect` and `boxPoints` (opencv-python-headless
    /// 5.0.0.93) on a border from the parity page and on small shapes:
    /// the same float32 bits, the 376.99997 that pyclipper truncates to 376
    /// included.
    #[test]
    fn minimum_area_rectangles_are_opencvs_to_the_bit() {
        let contour = pixels(&[
            [111, 377],
            [109, 379],
            [109, 383],
            [110, 384],
            [525, 384],
            [526, 385],
            [532, 385],
            [533, 384],
            [534, 385],
            [541, 385],
            [542, 384],
            [547, 384],
            [548, 385],
            [577, 385],
            [578, 384],
            [579, 384],
            [580, 385],
            [581, 385],
            [582, 384],
            [584, 384],
            [585, 383],
            [586, 383],
            [586, 379],
            [585, 379],
            [584, 378],
            [581, 378],
            [580, 377],
            [556, 377],
            [555, 378],
            [554, 378],
            [553, 377],
            [552, 377],
            [551, 378],
            [550, 378],
            [549, 377],
            [548, 377],
            [547, 378],
            [542, 378],
            [541, 377],
        ]);
        let r = min_area_rect(&contour, PointOrder::Contour).unwrap();
        assert_eq!(r.center, [347.49997, 380.99997]);
        assert_eq!(r.size, [7.999999, 476.99994]);
        assert_eq!(r.angle, -90.0);
        let (corners, _) = mini_box(&contour, PointOrder::Contour).unwrap();
        assert_eq!(corners[0], [109.0, 376.99997f32 as f64]);
        assert_eq!(corners[2], [585.99994f32 as f64, 384.99997f32 as f64]);
        // pyclipper's offset of that box, in its order.
        let grown = pixels(&[
            [588, 371],
            [591, 373],
            [591, 384],
            [590, 387],
            [588, 390],
            [109, 390],
            [106, 389],
            [103, 387],
            [103, 376],
            [104, 373],
            [106, 370],
            [585, 370],
        ]);
        let r = min_area_rect(&grown, PointOrder::Polygon).unwrap();
        assert_eq!(
            (r.center, r.size, r.angle),
            ([347.0, 380.0], [20.0, 488.0], -90.0)
        );
        // Two points, and a slanted quadrilateral's border.
        let r = min_area_rect(&[[1.0, 2.0], [5.0, 3.0]], PointOrder::Polygon).unwrap();
        assert_eq!(
            (r.center, r.size, r.angle),
            ([3.0, 2.5], [0.0, 4.1231055], -75.96375)
        );
        let quad = pixels(&[
            [6, 1],
            [2, 5],
            [3, 6],
            [3, 7],
            [4, 8],
            [4, 9],
            [5, 10],
            [7, 8],
            [8, 8],
            [10, 6],
            [8, 4],
            [8, 3],
        ]);
        let r = min_area_rect(&quad, PointOrder::Contour).unwrap();
        assert_eq!(
            (r.center, r.size, r.angle),
            ([5.750001, 5.75], [7.071068, 6.3639603], -45.0)
        );
        assert_eq!(
            box_points(&r),
            [
                [5.500001, 10.5],
                [1.0000012, 6.0],
                [6.000001, 1.0000002],
                [10.500001, 5.5]
            ]
        );
    }

    #[test]
    fn cubic_weights_sum_to_one_and_integer_shifts_copy() {
        for t in cubic_table() {
            assert_eq!(t.iter().sum::<i32>(), 32768);
        }
        let data: Vec<u8> = (0..5 * 4 * 3).map(|v| (v * 7 % 256) as u8).collect();
        let img = Planes {
            data: &data,
            width: 5,
            height: 4,
        };
        let src = [[1.0, 1.0], [4.0, 1.0], [4.0, 3.0], [1.0, 3.0]];
        let dst = [[0.0, 0.0], [3.0, 0.0], [3.0, 2.0], [0.0, 2.0]];
        let m = perspective_transform(&src, &dst).unwrap();
        let out = warp_perspective_cubic(&img, &m, 3, 2).unwrap();
        for y in 0..2 {
            for x in 0..3 {
                for c in 0..3 {
                    assert_eq!(
                        out[(y * 3 + x) * 3 + c],
                        data[((y + 1) * 5 + x + 1) * 3 + c]
                    );
                }
            }
        }
    }
}
