//! `wrk`, the load generator of the peer comparison: one run against one URL, its summary read
//! back from what it prints with `--latency`.
//!
//! The peer rows use wrk rather than the bench's own generator because that is what issue 17's
//! figures were taken with and what anyone can repeat against nginx and HAProxy by hand; the
//! generator is the same program for every row, so the ratios stay fair.

use std::time::Duration;

use super::super::BoxError;

/// One wrk run's shape.
#[derive(Clone, Debug)]
pub struct WrkSpec {
    pub threads: usize,
    pub connections: usize,
    /// wrk takes whole seconds; anything shorter is rounded up to one.
    pub duration: Duration,
    pub url: String,
}

/// What wrk reported for one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WrkResult {
    /// Completed requests (any status).
    pub requests: u64,
    pub seconds: f64,
    pub requests_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// "Non-2xx or 3xx responses" plus socket errors (connect, read, write, timeout).
    pub errors: u64,
}

/// Runs wrk to completion: HTTP/1.1 keep-alive, one request in flight per connection, the
/// client's `Accept: application/json` as kubectl sends it for a single object.
pub async fn run(spec: &WrkSpec) -> Result<WrkResult, BoxError> {
    let seconds = spec.duration.as_secs_f64().ceil().max(1.0) as u64;
    let mut cmd = tokio::process::Command::new("wrk");
    cmd.arg("-t")
        .arg(spec.threads.to_string())
        .arg("-c")
        .arg(spec.connections.to_string())
        .arg("-d")
        .arg(format!("{seconds}s"))
        .arg("--timeout")
        .arg("5s")
        .arg("--latency")
        .arg("-H")
        .arg("Accept: application/json")
        .arg(&spec.url)
        .kill_on_drop(true);
    // Bounded: wrk stops itself after `-d`; the margin covers connecting and a slow exit.
    let output = tokio::time::timeout(Duration::from_secs(seconds + 30), cmd.output())
        .await
        .map_err(|_| {
            format!(
                "wrk against {} did not finish in {}s",
                spec.url,
                seconds + 30
            )
        })?
        .map_err(|e| format!("running wrk: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "wrk against {} failed ({}): {}{}",
            spec.url,
            output.status,
            stdout,
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    parse(&stdout).map_err(|e| format!("reading wrk's output ({e}):\n{stdout}").into())
}

/// Reads wrk 4's `--latency` summary.
pub fn parse(out: &str) -> Result<WrkResult, String> {
    let mut r = WrkResult::default();
    let (mut have_requests, mut have_rate, mut have_p99) = (false, false, false);
    for line in out.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("50%") {
            r.p50_ms = duration_ms(rest.trim())?;
        } else if let Some(rest) = line.strip_prefix("99%") {
            r.p99_ms = duration_ms(rest.trim())?;
            have_p99 = true;
        } else if let Some(rest) = line.strip_prefix("Requests/sec:") {
            r.requests_per_s = rest
                .trim()
                .parse()
                .map_err(|e| format!("Requests/sec {rest:?}: {e}"))?;
            have_rate = true;
        } else if let Some(rest) = line.strip_prefix("Non-2xx or 3xx responses:") {
            r.errors += rest.trim().parse::<u64>().map_err(|e| e.to_string())?;
        } else if let Some(rest) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            for part in rest.split(',') {
                if let Some(n) = part.split_whitespace().nth(1) {
                    r.errors += n.parse::<u64>().map_err(|e| e.to_string())?;
                }
            }
        } else if let Some((count, rest)) = line.split_once(" requests in ") {
            // "24567 requests in 1.00s, 10.12MB read"
            r.requests = count
                .trim()
                .parse()
                .map_err(|e| format!("request count {count:?}: {e}"))?;
            let time = rest.split(',').next().unwrap_or("").trim();
            r.seconds = duration_ms(time)? / 1e3;
            have_requests = true;
        }
    }
    match (have_requests, have_rate, have_p99) {
        (true, true, true) => Ok(r),
        _ => Err("no request count, Requests/sec or 99% line".to_owned()),
    }
}

/// A wrk duration (`812.00us`, `1.23ms`, `2.00s`, `1.00m`) in milliseconds.
fn duration_ms(text: &str) -> Result<f64, String> {
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .ok_or_else(|| format!("{text:?} has no unit"))?;
    let (number, unit) = text.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|e| format!("duration {text:?}: {e}"))?;
    let scale = match unit {
        "us" => 1e-3,
        "ms" => 1.0,
        "s" => 1e3,
        "m" => 60e3,
        "h" => 3600e3,
        _ => return Err(format!("duration {text:?}: unknown unit {unit:?}")),
    };
    Ok(n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// wrk 4.1.0's output against nginx in this bench, with a non-2xx line and socket errors
    /// added as wrk prints them when they happen.
    const SAMPLE: &str =
        "Running 3s test @ https://127.0.0.1:40111/api/v1/namespaces/default/configmaps/bench
  2 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.01ms  612.33us  12.41ms   81.05%
    Req/Sec     8.06k   410.28     8.77k    71.67%
  Latency Distribution
     50%    1.93ms
     75%    2.21ms
     90%    2.60ms
     99%    4.05ms
  48125 requests in 3.00s, 20.56MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:  16040.45
Transfer/sec:      6.85MB
";

    #[test]
    fn reads_the_summary() {
        let r = parse(SAMPLE).unwrap();
        assert_eq!(r.requests, 48125);
        assert_eq!(r.seconds, 3.0);
        assert_eq!(r.requests_per_s, 16040.45);
        assert_eq!(r.p50_ms, 1.93);
        assert_eq!(r.p99_ms, 4.05);
        assert_eq!(r.errors, 7);
    }

    #[test]
    fn latency_units() {
        assert!((duration_ms("812.00us").unwrap() - 0.812).abs() < 1e-9);
        assert_eq!(duration_ms("1.50s").unwrap(), 1500.0);
        assert!(duration_ms("3").is_err());
    }

    #[test]
    fn output_without_a_summary_is_an_error() {
        assert!(parse("unable to connect to 127.0.0.1:1 Connection refused\n").is_err());
    }
}
