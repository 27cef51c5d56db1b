//! The programs from outside the project that some sections run (nginx, wrk, HAProxy, PostgreSQL), looked
//! for before anything runs: a run that needs one the machine lacks says so at once, instead of failing after
//! the cluster sections' ten minutes. `tests/prereqs.sh tests` installs them all on Debian.

use std::path::{Path, PathBuf};

/// A program a section runs, where the bench will look for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    pub name: &'static str,
    /// The Debian package that has it.
    pub package: &'static str,
    pub path: PathBuf,
}

impl Program {
    pub fn nginx() -> Self {
        Self {
            name: "nginx",
            package: "nginx-light",
            path: PathBuf::from(crate::server::NGINX),
        }
    }

    pub fn wrk() -> Self {
        Self {
            name: "wrk",
            package: "wrk",
            path: on_path("wrk"),
        }
    }

    pub fn haproxy() -> Self {
        Self {
            name: "HAProxy",
            package: "haproxy",
            path: windvane_tests::haproxy::haproxy_binary(),
        }
    }

    pub fn postgres() -> Self {
        Self {
            name: "PostgreSQL's initdb",
            package: "postgresql",
            path: windvane_tests::postgres::find_bin()
                .unwrap_or_else(|| PathBuf::from("/usr/lib/postgresql/VERSION/bin"))
                .join("initdb"),
        }
    }
}

/// `name` in the first directory of `$PATH` that has it (as it is when none does).
fn on_path(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// One line for each program a section needs (`(section, programs)`) that `exists` does not find.
pub fn missing(
    needs: impl IntoIterator<Item = (String, Vec<Program>)>,
    exists: impl Fn(&Path) -> bool,
) -> Vec<String> {
    needs
        .into_iter()
        .flat_map(|(section, programs)| {
            programs
                .into_iter()
                .filter(|program| !exists(&program.path))
                .map(move |program| {
                    format!(
                        "the {section} section needs {} ({}; Debian package {}), which is not there",
                        program.name,
                        program.path.display(),
                        program.package
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_a_chosen_section_needs_and_lacks_is_named_with_its_package() {
        let needs = || {
            vec![
                ("sync".to_owned(), Vec::new()),
                (
                    "pointer-304".to_owned(),
                    vec![Program::nginx(), Program::wrk()],
                ),
            ]
        };
        let lines = missing(needs(), |_| false);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[0].contains("pointer-304")
                && lines[0].contains("/usr/sbin/nginx")
                && lines[0].contains("nginx-light"),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("wrk"), "{}", lines[1]);
        let only_wrk = missing(needs(), |path| path.ends_with("nginx"));
        assert_eq!(only_wrk.len(), 1);
        assert!(missing(needs(), |_| true).is_empty());
    }
}
