//! The direct and through-gateway runs side by side, and the verdict on them.

use std::fmt;

use super::{Focus, Run, NEEDS_MORE_THAN_ONE_NODE};

/// The through-gateway run may take this much longer than the direct one (issue 38).
const MAX_SLOWDOWN: f64 = 1.2;

/// Direct and through-gateway runs side by side.
pub struct Table {
    direct: Run,
    gateway: Run,
}

impl Table {
    pub fn new(direct: &Run, gateway: &Run) -> Table {
        Table {
            direct: direct.clone(),
            gateway: gateway.clone(),
        }
    }

    fn passed(run: &Run) -> Vec<&String> {
        run.specs
            .iter()
            .filter(|(_, s)| s.status == "passed")
            .map(|(name, _)| name)
            .collect()
    }

    /// The set passing directly passes through the gateway, in at most 1.2× the time; a spec
    /// failing directly is not counted.
    pub fn verdict(&self) -> Result<(), String> {
        let direct = Self::passed(&self.direct);
        let gateway = Self::passed(&self.gateway);
        let lost: Vec<&&String> = direct.iter().filter(|n| !gateway.contains(n)).collect();
        if !lost.is_empty() {
            return Err(format!(
                "{} spec(s) pass directly but not through the gateway: {lost:?}",
                lost.len()
            ));
        }
        let ratio = self.gateway.wall.as_secs_f64() / self.direct.wall.as_secs_f64();
        if ratio > MAX_SLOWDOWN {
            return Err(format!(
                "through the gateway {:.0} s, directly {:.0} s: {ratio:.2}× (at most {MAX_SLOWDOWN}×)",
                self.gateway.wall.as_secs_f64(),
                self.direct.wall.as_secs_f64()
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| spec | direct | s | gateway | s |")?;
        writeln!(f, "|---|---|---:|---|---:|")?;
        let names: std::collections::BTreeSet<&String> = self
            .direct
            .specs
            .keys()
            .chain(self.gateway.specs.keys())
            .collect();
        let cell = |run: &Run, name: &str| match run.specs.get(name) {
            Some(s) => (s.status.clone(), format!("{:.1}", s.seconds)),
            None => ("-".into(), "-".into()),
        };
        for name in names {
            let short = name.as_str();
            let (ds, dt) = cell(&self.direct, name);
            let (gs, gt) = cell(&self.gateway, name);
            writeln!(f, "| {short} | {ds} | {dt} | {gs} | {gt} |")?;
        }
        let failed_directly: Vec<&String> = self
            .direct
            .specs
            .iter()
            .filter(|(_, s)| s.status != "passed")
            .map(|(name, _)| name)
            .collect();
        if !failed_directly.is_empty() {
            writeln!(
                f,
                "| failing directly (not counted): {failed_directly:?} | | | | |"
            )?;
        }
        if self.direct.focus == Focus::Conformance {
            for (spec, why) in NEEDS_MORE_THAN_ONE_NODE {
                writeln!(f, "| skipped: {spec} ({why}) | | | | |")?;
            }
        }
        writeln!(
            f,
            "| **all ({} / {} passed)** | | **{:.0}** | | **{:.0}** ({:.2}×) |",
            Self::passed(&self.direct).len(),
            Self::passed(&self.gateway).len(),
            self.direct.wall.as_secs_f64(),
            self.gateway.wall.as_secs_f64(),
            self.gateway.wall.as_secs_f64() / self.direct.wall.as_secs_f64()
        )
    }
}
