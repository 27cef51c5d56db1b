//! Who is in the demo's fleet: the rule that turns `--clusters N` into named, labelled clusters, and which of
//! them each scene uses. It is pure (no process, no I/O) so the rule is tested on its own.
//!
//! The rule: of the N initial clusters, `max(2, N/4)` are `env=prod`, `max(1, N/3)` `env=staging` and the
//! rest `env=dev` (N = 3: 2/1/0, today's prod-eu, prod-us, staging-eu; N = 12: 3/4/5). Within an env the
//! clusters take the regions in [`REGIONS`] order and are named `ENV-REGION`; the cluster that joins later is
//! the next `env=prod` one (prod-ap at N = 3, prod-sa at N = 12). N is clamped to [`MIN_CLUSTERS`]..=
//! [`MAX_CLUSTERS`]: fewer could not tell the story, more would not fit a laptop.

/// The fewest initial clusters the story needs: two prod clusters (one drifts, one goes quiet) and a staging one.
pub const MIN_CLUSTERS: usize = 3;
/// The most: each cluster is a real control plane of ~350 MB and some CPU.
pub const MAX_CLUSTERS: usize = 24;
/// The regions clusters of an env take, in order. `eu` comes first: the example fleet customizes it.
pub const REGIONS: [&str; 12] = [
    "eu", "us", "ap", "sa", "af", "me", "ca", "au", "jp", "br", "in", "kr",
];

/// One cluster of the story: its env and region; its name is `ENV-REGION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub env: &'static str,
    pub region: &'static str,
}

impl Member {
    pub fn name(&self) -> String {
        format!("{}-{}", self.env, self.region)
    }

    pub fn labels(&self) -> String {
        format!("env={},region={}", self.env, self.region)
    }
}

/// The fleet of a given size: the clusters started first, and the one that joins later.
#[derive(Debug, Clone)]
pub struct Roster {
    pub initial: Vec<Member>,
    pub joiner: Member,
}

/// How many initial clusters are prod, staging and dev.
pub fn mix(clusters: usize) -> (usize, usize, usize) {
    let prod = (clusters / 4).max(2);
    let staging = (clusters / 3).max(1);
    (prod, staging, clusters - prod - staging)
}

/// Parses `--clusters`: a whole number in [`MIN_CLUSTERS`]..=[`MAX_CLUSTERS`].
pub fn parse_clusters(text: &str) -> Result<usize, String> {
    let n: usize = text
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    if !(MIN_CLUSTERS..=MAX_CLUSTERS).contains(&n) {
        return Err(format!(
            "{n} is outside {MIN_CLUSTERS}..={MAX_CLUSTERS}: the story needs at least {MIN_CLUSTERS} \
             clusters (two env=prod, one env=staging), and each is a real control plane (~350 MB)"
        ));
    }
    Ok(n)
}

impl Roster {
    /// The roster for `clusters` initial clusters (already checked by [`parse_clusters`]).
    pub fn new(clusters: usize) -> Self {
        let (prod, staging, dev) = mix(clusters);
        let take = |env: &'static str, n: usize| {
            REGIONS
                .iter()
                .take(n)
                .map(move |region| Member { env, region })
        };
        let initial = take("prod", prod)
            .chain(take("staging", staging))
            .chain(take("dev", dev))
            .collect();
        Self {
            initial,
            joiner: Member {
                env: "prod",
                region: REGIONS[prod],
            },
        }
    }

    /// The prod cluster someone scales Deployments on: prod-eu (the EU customization shows there too).
    pub fn drifting(&self) -> Member {
        self.initial[0]
    }

    /// The prod cluster that loses a pod and later its network: prod-us.
    pub fn quiet(&self) -> Member {
        self.initial[1]
    }

    /// The initial clusters of `env`.
    pub fn of_env(&self, env: &str) -> Vec<Member> {
        self.initial
            .iter()
            .copied()
            .filter(|m| m.env == env)
            .collect()
    }

    /// Every env with clusters, prod first, with how many initial clusters it has.
    pub fn envs(&self) -> Vec<(&'static str, usize)> {
        ["prod", "staging", "dev"]
            .into_iter()
            .map(|env| (env, self.of_env(env).len()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// "fourth", "thirteenth", … for the joining cluster's heading (numbers past the range read `25th`).
pub fn ordinal(n: usize) -> String {
    const WORDS: [&str; 21] = [
        "zeroth",
        "first",
        "second",
        "third",
        "fourth",
        "fifth",
        "sixth",
        "seventh",
        "eighth",
        "ninth",
        "tenth",
        "eleventh",
        "twelfth",
        "thirteenth",
        "fourteenth",
        "fifteenth",
        "sixteenth",
        "seventeenth",
        "eighteenth",
        "nineteenth",
        "twentieth",
    ];
    match n {
        0..=20 => WORDS[n].to_owned(),
        21..=29 => format!("twenty-{}", WORDS[n - 20]),
        _ => format!("{n}th"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(members: &[Member]) -> Vec<String> {
        members.iter().map(Member::name).collect()
    }

    #[test]
    fn three_clusters_are_todays_story() {
        let roster = Roster::new(3);
        assert_eq!(names(&roster.initial), ["prod-eu", "prod-us", "staging-eu"]);
        assert_eq!(roster.joiner.name(), "prod-ap");
        assert_eq!(roster.drifting().name(), "prod-eu");
        assert_eq!(roster.quiet().name(), "prod-us");
        assert_eq!(roster.envs(), [("prod", 2), ("staging", 1)]);
    }

    #[test]
    fn twelve_clusters_are_three_prod_four_staging_five_dev() {
        let roster = Roster::new(12);
        assert_eq!(mix(12), (3, 4, 5));
        assert_eq!(roster.envs(), [("prod", 3), ("staging", 4), ("dev", 5)]);
        assert_eq!(roster.joiner.name(), "prod-sa");
        assert_eq!(roster.joiner.labels(), "env=prod,region=sa");
    }

    #[test]
    fn every_size_has_unique_names_and_a_new_joiner() {
        for n in MIN_CLUSTERS..=MAX_CLUSTERS {
            let roster = Roster::new(n);
            let mut all = names(&roster.initial);
            all.push(roster.joiner.name());
            let count = all.len();
            all.sort();
            all.dedup();
            assert_eq!(all.len(), count, "{n} clusters: duplicate names");
            assert_eq!(roster.initial.len(), n);
            assert!(roster.of_env("prod").len() >= 2 && !roster.of_env("staging").is_empty());
        }
    }

    #[test]
    fn sizes_outside_the_range_are_refused_with_the_range() {
        assert_eq!(parse_clusters("12"), Ok(12));
        for bad in ["2", "25", "0", "-1", "twelve"] {
            let error = parse_clusters(bad).expect_err(bad);
            assert!(
                error.contains("3..=24") || error.contains("not a whole number"),
                "{error}"
            );
        }
    }

    #[test]
    fn ordinals_read_as_words() {
        assert_eq!(ordinal(4), "fourth");
        assert_eq!(ordinal(13), "thirteenth");
        assert_eq!(ordinal(25), "twenty-fifth");
    }
}
