//! The host side of the node: its address, packet forwarding, and the rule that keeps Pod
//! traffic on this machine. Everything changed is recorded and undone on drop, in reverse order,
//! together with what the node left behind (kube-proxy's and the CNI plugins' iptables chains,
//! the bridge, Pod network namespaces).
//!
//! - The node's IP is an alias on `lo` (`/32`), so nothing listens on a real interface; Pods live
//!   on the CNI bridge `cni0` (10.244.0.0/24), Service IPs (10.96.0.0/16) exist only as
//!   kube-proxy's rules.
//! - A `FORWARD` rule drops whatever leaves the Pod network other than through `cni0`: no Pod can
//!   send anything off the machine, and cluster DNS answers `cluster.local` only.

use std::process::Command;

use super::pki::NODE_IP;

/// The Pod network (the bridge's subnet is the node's /24 of it).
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The node's Pod subnet.
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The Service range.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The bridge the CNI plugin creates.
pub const BRIDGE: &str = "cni0";

const SYSCTLS: [&str; 2] = ["net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables"];

/// The host changes of one node, undone on drop.
pub struct HostNetwork {
    added_alias: bool,
    added_forward_rule: bool,
    sysctls: Vec<(&'static str, String)>,
}

impl HostNetwork {
    /// Adds the node's address, enables forwarding and bridge netfilter, and inserts the rule
    /// that keeps Pod traffic on the machine.
    ///
    /// # Errors
    /// When the node's address is already on `lo`: another node runs (only one can, its
    /// addresses, bridge and iptables chains are the machine's).
    pub fn set_up() -> Result<HostNetwork, String> {
        let alias = format!("{NODE_IP}/32");
        let addresses = output("ip", &["-o", "addr", "show", "dev", "lo"])?;
        if addresses.contains(&format!(" {alias} ")) {
            return Err(format!(
                "{NODE_IP} is already on lo: another real node is running on this machine (stop it \
                 first; only one node can own the bridge, the iptables chains and /var/lib/kubelet)"
            ));
        }
        let mut host = HostNetwork {
            added_alias: false,
            added_forward_rule: false,
            sysctls: Vec::new(),
        };
        run("ip", &["addr", "add", &alias, "dev", "lo"])?;
        host.added_alias = true;
        // bridge-nf-call-iptables exists only once br_netfilter is loaded; a kernel with it built
        // in has it anyway.
        let _ = Command::new("modprobe").arg("br_netfilter").status();
        for key in SYSCTLS {
            let old = output("sysctl", &["-n", key])?.trim().to_owned();
            run("sysctl", &["-qw", &format!("{key}=1")])?;
            host.sysctls.push((key, old));
        }
        run("iptables", &forward_rule("-I"))?;
        host.added_forward_rule = true;
        Ok(host)
    }
}

fn forward_rule(action: &str) -> Vec<&str> {
    let mut rule = vec![action, "FORWARD"];
    if action == "-I" {
        rule.push("1");
    }
    rule.extend(["-s", CLUSTER_CIDR, "!", "-o", BRIDGE, "-j", "DROP"]);
    rule
}

impl Drop for HostNetwork {
    fn drop(&mut self) {
        // Chains kube-proxy and the CNI plugins created: flushed, unlinked, deleted.
        for table in ["nat", "filter", "mangle"] {
            let Ok(rules) = output("iptables", &["-t", table, "-S"]) else {
                continue;
            };
            let ours = |name: &str| name.starts_with("KUBE-") || name.starts_with("CNI-");
            let chains: Vec<&str> = rules
                .lines()
                .filter_map(|l| l.strip_prefix("-N "))
                .filter(|c| ours(c))
                .collect();
            for rule in rules.lines().filter_map(|l| l.strip_prefix("-A ")) {
                let words: Vec<&str> = rule.split_whitespace().collect();
                let jumps_to_ours = words.windows(2).any(|w| w[0] == "-j" && ours(w[1]));
                if !chains.contains(&words[0]) && jumps_to_ours {
                    let mut args: Vec<String> = vec!["-t".into(), table.into(), "-D".into()];
                    args.extend(shell_words(rule));
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let _ = run("iptables", &args);
                }
            }
            for chain in &chains {
                let _ = run("iptables", &["-t", table, "-F", chain]);
            }
            for chain in &chains {
                let _ = run("iptables", &["-t", table, "-X", chain]);
            }
        }
        if self.added_forward_rule {
            let _ = run("iptables", &forward_rule("-D"));
        }
        let _ = run("ip", &["link", "del", BRIDGE]);
        if let Ok(namespaces) = output("ip", &["netns", "list"]) {
            for ns in namespaces
                .lines()
                .filter_map(|l| l.split_whitespace().next())
            {
                if ns.starts_with("cni-") {
                    let _ = run("ip", &["netns", "del", ns]);
                }
            }
        }
        for (key, old) in self.sysctls.drain(..).rev() {
            let _ = run("sysctl", &["-qw", &format!("{key}={old}")]);
        }
        if self.added_alias {
            let _ = run(
                "ip",
                &["addr", "del", &format!("{NODE_IP}/32"), "dev", "lo"],
            );
        }
    }
}

/// Splits an `iptables -S` rule into words, keeping double-quoted comments whole.
fn shell_words(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut chars = rule.chars();
    while let Some(c) = chars.next() {
        match c {
            // iptables -S escapes a quote inside a quoted comment (the CNI plugins' `name:
            // \"real-node\" id: \"...\"`); taken as a toggle, the rule was never deleted and its
            // chain stayed behind.
            '\\' if quoted => current.extend(chars.next()),
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !current.is_empty() {
                    words.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// Runs a host command; its stderr in the error.
pub fn run(program: &str, args: &[&str]) -> Result<(), String> {
    output(program, args).map(drop)
}

/// Runs a host command and returns its stdout.
pub fn output(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cni_rule_with_escaped_quotes_splits_as_the_shell_would() {
        let rule = r#"POSTROUTING -s 10.244.0.2/32 -m comment --comment "name: \"real-node\" id: \"b209\"" -j CNI-0379"#;
        assert_eq!(
            shell_words(rule),
            [
                "POSTROUTING",
                "-s",
                "10.244.0.2/32",
                "-m",
                "comment",
                "--comment",
                r#"name: "real-node" id: "b209""#,
                "-j",
                "CNI-0379",
            ]
        );
    }

    #[test]
    fn iptables_rules_split_with_quoted_comments() {
        assert_eq!(
            shell_words(
                r#"PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES"#
            ),
            [
                "PREROUTING",
                "-m",
                "comment",
                "--comment",
                "kubernetes service portals",
                "-j",
                "KUBE-SERVICES"
            ]
        );
    }
}
