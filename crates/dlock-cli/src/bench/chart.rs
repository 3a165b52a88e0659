//! The SVG chart: throughput (W1, W2, W4) and p99 acquire latency (W1) per backend, side by
//! side, so the backends compare at a glance.

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
    let root = SVGBackend::new(path, (1100, height)).into_drawing_area();
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

    let max_p99 = backends
        .iter()
        .map(|b| value(b, "W1", |r| r.acquire_p99_us as f64) / 1000.0)
        .fold(0.1_f64, f64::max);
    let mut lat = ChartBuilder::on(&right)
        .caption("W1 cycle latency p50 / p99 (ms)", ("sans-serif", 15))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(150)
        .build_cartesian_2d(0.0..max_p99 * 1.1, 0..n * 3)?;
    lat.configure_mesh()
        .disable_y_mesh()
        .y_labels((n * 3) as usize)
        .y_label_formatter(&|y| {
            let i = (*y / 3) as usize;
            if *y % 3 == 1 {
                backends.get(i).map_or(String::new(), |b| (*b).to_owned())
            } else {
                String::new()
            }
        })
        .draw()?;
    for (i, b) in backends.iter().enumerate() {
        let p50 = value(b, "W1", |r| r.acquire_p50_us as f64) / 1000.0;
        let p99 = value(b, "W1", |r| r.acquire_p99_us as f64) / 1000.0;
        let y = i as i32 * 3;
        lat.draw_series(std::iter::once(Rectangle::new(
            [(0.0, y), (p50, y + 1)],
            COLORS[0].filled(),
        )))?;
        lat.draw_series(std::iter::once(Rectangle::new(
            [(0.0, y + 1), (p99, y + 2)],
            COLORS[1].filled(),
        )))?;
    }
    for (j, label) in ["p50", "p99"].iter().enumerate() {
        lat.draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0), (0.0, 0)],
            COLORS[j].filled(),
        )))?
        .label(*label)
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], COLORS[j].filled()));
    }
    lat.configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}
