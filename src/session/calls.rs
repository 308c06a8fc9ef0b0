//! What every recipe asks of a session: calls bounded by the request
//! timeout, names and keys checked, errors labelled with the backend, and
//! the contenders of a queue listed.

use std::future::Future;

use super::SessionInner;
use crate::{name, Contender, Error, Result};

impl SessionInner {
    pub(crate) fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Bounds one server call by the request timeout.
    pub(crate) async fn call<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        let timeout = self.options.request_timeout();
        match tokio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(Error::unavailable(
                self.backend_name(),
                format!("no answer within the request timeout of {timeout:?}"),
            )),
        }
    }

    /// Every entry under `name`, for the recipes' `contenders()`.
    pub(crate) async fn contenders(&self, name: &str) -> Result<Vec<Contender>> {
        self.check_usable()?;
        let entries = self.call(self.remote.list(name)).await?;
        let mut contenders = Vec::with_capacity(entries.len());
        for (place, entry) in entries.into_iter().enumerate() {
            // A contender in lock-delay marks its own entry; only the first
            // few of a queue can be next in line.
            let delayed_until = if place < 4 && entry.kind != crate::EntryKind::Election {
                match self.call(self.remote.get_value(&entry)).await {
                    Ok(Some(value)) => crate::contender::delayed_until(&value),
                    _ => None,
                }
            } else {
                None
            };
            let mut contender = Contender::from(entry);
            contender.delayed_until = delayed_until;
            contenders.push(contender);
        }
        Ok(contenders)
    }

    /// Checks a key of a fenced write or a read.
    pub(crate) fn check_key(&self, key: &str) -> Result<()> {
        crate::write::validate_key(key)?;
        self.backend.validate_key(key)
    }

    /// Checks a key a fenced write creates or deletes.
    pub(crate) fn check_write_key(&self, key: &str) -> Result<()> {
        self.check_key(key)?;
        self.backend.validate_write_key(key)
    }

    /// Names the backend in an [`Error::Unsupported`] from a backend
    /// session's default method, which cannot know it.
    pub(crate) fn label(&self, error: Error) -> Error {
        match error {
            Error::Unsupported { operation, .. } => Error::Unsupported {
                backend: self.backend_name(),
                operation,
            },
            other => other,
        }
    }

    pub(crate) fn check_name(&self, name: &str) -> Result<()> {
        name::validate(name)?;
        self.backend.validate_name(name)
    }
}
