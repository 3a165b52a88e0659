//! The SVG chart: throughput (W1, W2, W4), W1 latency (p50, p99), client CPU per cycle (W1,
//! W4) and W2's owner switches (unfair and fair) per backend, side by side, so the backends
//! compare at a glance.

use std::path::Path;

use plotters::prelude::*;

use super::Row;

const COLORS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
];

/// `1500` → `1.5k`, `230000` → `230k`.
fn compact(v: f64) -> String {
    if v >= 1_000_000.0 {
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
    let height = 120 + 60 * backends.len() as u32;
    let root = SVGBackend::new(path, (2000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(650);
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
    root.present()?;
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
