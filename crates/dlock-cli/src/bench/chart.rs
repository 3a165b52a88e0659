//! The SVG chart: throughput (W1, W2, W4), W1 latency (p50, p99), client CPU per cycle (W1,
//! W4) and W2's owner switches (unfair and fair) per backend, side by side, so the backends
//! compare at a glance; below them, where the run has them, the curves of scale: W8P's cycles
//! per second and p99 by worker processes, and W8's calls to the store per second by holds.

use std::path::Path;

use plotters::prelude::*;

use super::Row;

const COLORS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
];

/// `1500` → `2k`, `230000` → `230k`, `0.25` → `0.25`.
fn compact(v: f64) -> String {
    if v < 1.0 {
        format!("{v:.2}")
    } else if v < 10.0 {
        format!("{v:.1}")
    } else if v >= 1_000_000.0 {
        format!("{:.0}M", v / 1_000_000.0)
    } else if v >= 1000.0 {
        format!("{:.0}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

pub(super) fn draw(path: &Path, rows: &[Row]) -> Result<(), Box<dyn std::error::Error>> {
    let mut backends: Vec<&str> = Vec::new();
    for r in rows {
        if r.skipped.is_none() && !backends.contains(&r.backend.as_str()) {
            backends.push(&r.backend);
        }
    }
    if backends.is_empty() {
        return Err("no results to draw".into());
    }
    let value = |backend: &str, workload: &str, f: fn(&Row) -> f64| {
        rows.iter()
            .find(|r| r.backend == backend && r.workload == workload && r.skipped.is_none())
            .map_or(0.0, f)
    };
    let bars_height = 120 + 60 * backends.len() as u32;
    let scaled = rows.iter().any(|r| scale_point(r).is_some());
    let height = bars_height + if scaled { CURVES_HEIGHT } else { 0 };
    let root = SVGBackend::new(path, (2000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(bars_height);
    let (left, right) = top.split_horizontally(650);
    let workloads = ["W1", "W2", "W4"];

    let max_tput = backends
        .iter()
        .flat_map(|b| {
            workloads
                .iter()
                .map(move |w| value(b, w, |r| r.cycles_per_sec))
        })
        .fold(1.0_f64, f64::max);
    let n = backends.len() as i32;
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "throughput, cycles/s (log scale): W1 one client, W2 8 on one name, W4 8 on own names",
            ("sans-serif", 15),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(150)
        .build_cartesian_2d((1.0..max_tput * 2.0).log_scale(), 0..n * 4)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_label_formatter(&|v| compact(*v))
        .y_labels((n * 4) as usize)
        .y_label_formatter(&|y| {
            let i = (*y / 4) as usize;
            if *y % 4 == 1 {
                backends.get(i).map_or(String::new(), |b| (*b).to_owned())
            } else {
                String::new()
            }
        })
        .draw()?;
    for (i, b) in backends.iter().enumerate() {
        for (j, w) in workloads.iter().enumerate() {
            let v = value(b, w, |r| r.cycles_per_sec).max(1.0);
            let y = i as i32 * 4 + j as i32;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(1.0, y), (v, y + 1)],
                COLORS[j].filled(),
            )))?;
        }
    }
    for (j, w) in workloads.iter().enumerate() {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(1.0, 0), (1.0, 0)],
                COLORS[j].filled(),
            )))?
            .label(*w)
            .legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 10, y + 5)], COLORS[j].filled())
            });
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;

    let (middle, rest) = right.split_horizontally(450);
    let (cpu_area, switch_area) = rest.split_horizontally(450);
    let series = |w: &'static str, f: fn(&Row) -> f64| -> Vec<f64> {
        backends.iter().map(|b| value(b, w, f)).collect()
    };
    // One metric for each of two workloads, each series labelled with its workload.
    let by_workload = |ws: [&'static str; 2], f: fn(&Row) -> f64| ws.map(|w| (w, series(w, f)));
    bars(
        &middle,
        "W1 cycle latency p50 / p99 (ms)",
        &backends,
        &[
            ("p50", series("W1", |r| r.acquire_p50_us as f64 / 1000.0)),
            (
                "p99",
                series("W1", |r| {
                    r.acquire_p99_us.map_or(0.0, |v| v as f64 / 1000.0)
                }),
            ),
        ],
    )?;
    bars(
        &cpu_area,
        "client CPU per cycle (µs): W1, W4",
        &backends,
        &by_workload(["W1", "W4"], |r| r.cpu_us_per_cycle.unwrap_or(0.0)),
    )?;
    bars(
        &switch_area,
        "W2 owner switches (%): unfair, fair",
        &backends,
        &by_workload(["W2", "W2F"], |r| r.owner_switch_pct.unwrap_or(0.0)),
    )?;
    if scaled {
        let (processes, rest) = bottom.split_horizontally(700);
        let (p99, holds) = rest.split_horizontally(650);
        curves(
            &processes,
            "W8P: cycles/s by worker processes (log-log)",
            rows,
            Scale::Processes,
            |r| r.cycles_per_sec,
        )?;
        curves(
            &p99,
            "W8P: cycle p99 (ms) by worker processes (log-log)",
            rows,
            Scale::Processes,
            |r| r.acquire_p99_us.map_or(0.0, |v| v as f64 / 1000.0),
        )?;
        curves(
            &holds,
            "W8: renewal calls to the store per second by holds (log-log)",
            rows,
            Scale::Holds,
            |r| r.renewal_calls_per_sec.unwrap_or(0.0),
        )?;
    }
    root.present()?;
    Ok(())
}

/// The height of the strip of curves.
const CURVES_HEIGHT: u32 = 450;

/// What a curve runs along.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scale {
    /// W8P's worker processes.
    Processes,
    /// W8's holds.
    Holds,
}

/// Where a row lies on a curve: W8P's processes or W8's holds (neither for other rows).
fn scale_point(r: &Row) -> Option<(Scale, f64)> {
    if r.skipped.is_some() {
        return None;
    }
    if r.workload.starts_with("W8P/") {
        return r.processes.map(|p| (Scale::Processes, p as f64));
    }
    if r.workload.starts_with("W8/") {
        return r.holds.map(|h| (Scale::Holds, h as f64));
    }
    None
}

/// A log-log panel of one curve per backend: `value` of its rows along `scale`.
fn curves(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    rows: &[Row],
    scale: Scale,
    value: fn(&Row) -> f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut lines: Vec<(&str, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let Some((s, x)) = scale_point(r) else {
            continue;
        };
        let y = value(r);
        if s != scale || y <= 0.0 {
            continue;
        }
        match lines.iter_mut().find(|(b, _)| *b == r.backend) {
            Some((_, points)) => points.push((x, y)),
            None => lines.push((&r.backend, vec![(x, y)])),
        }
    }
    let (mut x_max, mut y_min, mut y_max) = (2.0_f64, f64::MAX, 1.0_f64);
    for (_, points) in &lines {
        for (x, y) in points {
            x_max = x_max.max(*x);
            y_min = y_min.min(*y);
            y_max = y_max.max(*y);
        }
    }
    let y_min = if y_min == f64::MAX { 0.1 } else { y_min / 2.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(15)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(
            (1.0..x_max * 1.5).log_scale(),
            (y_min..y_max * 2.0).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_label_formatter(&|v| compact(*v))
        .y_label_formatter(&|v| compact(*v))
        .draw()?;
    for (i, (backend, points)) in lines.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(backend)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 15, y)], color.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    Ok(())
}

/// A panel of horizontal bars: for each backend, one bar per series (at most 3), linear scale.
fn bars(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    backends: &[&str],
    series: &[(&str, Vec<f64>)],
) -> Result<(), Box<dyn std::error::Error>> {
    let n = backends.len() as i32;
    let per = series.len() as i32 + 1;
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(0.1_f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(150)
        .build_cartesian_2d(0.0..max * 1.1, 0..n * per)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels((n * per) as usize)
        .y_label_formatter(&|y| {
            let i = (*y / per) as usize;
            if *y % per == 1 {
                backends.get(i).map_or(String::new(), |b| (*b).to_owned())
            } else {
                String::new()
            }
        })
        .draw()?;
    for (j, (label, values)) in series.iter().enumerate() {
        let color = COLORS[j % COLORS.len()];
        for (i, v) in values.iter().enumerate() {
            let y = i as i32 * per + j as i32;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(0.0, y), (*v, y + 1)],
                color.filled(),
            )))?;
        }
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, 0), (0.0, 0)],
                color.filled(),
            )))?
            .label(*label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    Ok(())
}
