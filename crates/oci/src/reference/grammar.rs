//! The reference grammar of the distribution project
//! (`distribution/reference`'s regexp.go), checked by hand.
//!
//! Why not `oci_client::Reference::try_from`, which checks the same grammar
//! with one regex: that regex has `[\w][\w.-]{0,127}` for the tag, and with
//! Unicode `\w` compiling it peaked at 20 MB of heap. Every `sluice pull`,
//! `push` and `inspect` parses one reference, so that compile was most of
//! the CLI's RSS (67 of 12 MiB for `--help` with the image's allocator).
//! This is a linear scan over the same grammar, with two deliberate
//! differences: a tag is ASCII (`[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`, as the
//! OCI distribution spec writes it; a registry refuses anything else), and
//! the first component, a registry host here, must be a host. The tests
//! compare it with the crate's parser over generated references.

/// The parts of `registry/repository[:tag][@digest]`, not yet normalised.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Parts<'a> {
    pub host: &'a str,
    pub repository: &'a str,
    pub tag: Option<&'a str>,
    pub digest: Option<&'a str>,
}

/// Longest repository path, as the distribution project and oci-spec allow.
const MAX_REPOSITORY: usize = 255;
const MAX_TAG: usize = 128;

/// Splits and checks `text`, whose first component has been found to be a
/// host (it has a `.` or `:`, or is `localhost`).
pub(super) fn parse(text: &str) -> Result<Parts<'_>, String> {
    let (name_and_tag, digest) = match text.split_once('@') {
        Some((left, digest)) => (left, Some(digest)),
        None => (text, None),
    };
    if let Some(digest) = digest {
        check_digest(digest)?;
    }
    // A tag's `:` comes after the last `/`; a port's comes before it.
    let last_slash = name_and_tag.rfind('/').ok_or("expected registry/repository")?;
    let (name, tag) = match name_and_tag[last_slash..].rfind(':') {
        Some(colon) => (&name_and_tag[..last_slash + colon], Some(&name_and_tag[last_slash + colon + 1..])),
        None => (name_and_tag, None),
    };
    if let Some(tag) = tag {
        check_tag(tag)?;
    }
    let (host, repository) = name.split_once('/').ok_or("expected registry/repository")?;
    check_host(host)?;
    if repository.len() > MAX_REPOSITORY {
        return Err(format!("the repository is longer than {MAX_REPOSITORY} characters"));
    }
    for component in repository.split('/') {
        check_path_component(component)?;
    }
    Ok(Parts { host, repository, tag, digest })
}

/// `domain-component(.domain-component)*(:port)?`, a domain component being
/// ASCII letters and digits with inner dashes.
fn check_host(host: &str) -> Result<(), String> {
    let (domain, port) = match host.split_once(':') {
        Some((domain, port)) => (domain, Some(port)),
        None => (host, None),
    };
    if let Some(port) = port
        && (port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("{host:?}: the port is not a number"));
    }
    let valid = |part: &str| {
        !part.is_empty()
            && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !part.starts_with('-')
            && !part.ends_with('-')
    };
    if !domain.split('.').all(valid) {
        return Err(format!("{host:?} is not a registry host"));
    }
    Ok(())
}

/// `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*`: lower-case alphanumeric runs
/// joined by one `.`, one or two `_`, or any number of `-`.
fn check_path_component(component: &str) -> Result<(), String> {
    let invalid =
        || Err(format!("{component:?} is not a repository path component (lower-case letters, digits, . _ -)"));
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    loop {
        // A run of alphanumerics.
        let start = i;
        while i < bytes.len() && alnum(bytes[i]) {
            i += 1;
        }
        if i == start {
            return invalid();
        }
        if i == bytes.len() {
            return Ok(());
        }
        // A separator, then another run.
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        match &component[start..i] {
            "." | "_" | "__" => {}
            dashes if dashes.bytes().all(|b| b == b'-') => {}
            _ => return invalid(),
        }
    }
}

fn check_tag(tag: &str) -> Result<(), String> {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let valid = tag.len() <= MAX_TAG
        && tag.as_bytes().first().is_some_and(|&b| word(b))
        && tag.bytes().all(|b| word(b) || b == b'.' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(format!("{tag:?} is not a tag (1-128 of A-Z a-z 0-9 _ . -, not starting with . or -)"))
    }
}

/// `algorithm:hex`, the algorithm `[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*`
/// and at least 32 hex digits. Which algorithms are accepted is the
/// caller's rule (sha256 only).
fn check_digest(digest: &str) -> Result<(), String> {
    let invalid = || Err(format!("{digest:?} is not a digest (algorithm:hex)"));
    let Some((algorithm, hex)) = digest.split_once(':') else { return invalid() };
    let algorithm_ok = algorithm.split(['-', '_', '+', '.']).all(|part| {
        part.as_bytes().first().is_some_and(u8::is_ascii_alphabetic) && part.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    if !algorithm_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return invalid();
    }
    Ok(())
}
