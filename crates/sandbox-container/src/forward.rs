//! `forward_backend!`: an adapter's public backend type is a newtype over
//! [`ContainerBackend`](crate::ContainerBackend) (so it can carry its own config and
//! constructors); this writes its `Backend` and `ReapableBackend` impls once, for every
//! engine, instead of each adapter repeating the same forwarding.

/// Implements `sandbox_core::Backend` and `sandbox_core::ReapableBackend` for `$ty` by
/// forwarding every method to its `ContainerBackend` field `$field`; `diagnose` also records
/// why the endpoint was chosen (`$reason`, an expression of `$this: &$ty` giving a
/// `String`).
///
/// ```ignore
/// sandbox_container::forward_backend!(DockerBackend, inner, |this| {
///     this.config().endpoint_source.to_string()
/// });
/// ```
#[macro_export]
macro_rules! forward_backend {
    ($ty:ty, $field:ident, |$this:ident| $reason:expr) => {
        #[$crate::__private::async_trait]
        impl $crate::__private::Backend for $ty {
            fn name(&self) -> &str {
                $crate::__private::Backend::name(&self.$field)
            }

            fn capabilities(&self) -> $crate::__private::Capability {
                $crate::__private::Backend::capabilities(&self.$field)
            }

            fn isolation(&self) -> $crate::__private::IsolationTier {
                $crate::__private::Backend::isolation(&self.$field)
            }

            async fn create(
                &self,
                options: $crate::__private::CreateOptions,
            ) -> $crate::__private::Result<Box<dyn $crate::__private::Sandbox>> {
                $crate::__private::Backend::create(&self.$field, options).await
            }

            async fn connect(
                &self,
                id: &str,
            ) -> $crate::__private::Result<Box<dyn $crate::__private::Sandbox>> {
                $crate::__private::Backend::connect(&self.$field, id).await
            }

            fn as_reapable(&self) -> Option<&dyn $crate::__private::ReapableBackend> {
                Some(self)
            }

            async fn diagnose(&self) -> $crate::__private::EngineReport {
                let mut report = $crate::__private::Backend::diagnose(&self.$field).await;
                let $this = self;
                report.endpoint_reason = Some($reason);
                report
            }
        }

        #[$crate::__private::async_trait]
        impl $crate::__private::ReapableBackend for $ty {
            async fn list_managed(
                &self,
                labels: &::std::collections::BTreeMap<String, String>,
            ) -> $crate::__private::Result<Vec<$crate::__private::ManagedSandbox>> {
                $crate::__private::ReapableBackend::list_managed(&self.$field, labels).await
            }

            /// Kills and removes one managed sandbox; an id that is not a sandbox-rs
            /// container is refused with `Configuration`.
            async fn kill_managed(&self, id: &str) -> $crate::__private::Result<bool> {
                $crate::__private::ReapableBackend::kill_managed(&self.$field, id).await
            }

            async fn list_snapshots(
                &self,
            ) -> $crate::__private::Result<Vec<$crate::__private::Snapshot>> {
                $crate::__private::ReapableBackend::list_snapshots(&self.$field).await
            }

            async fn remove_snapshot(&self, template: &str) -> $crate::__private::Result<bool> {
                $crate::__private::ReapableBackend::remove_snapshot(&self.$field, template).await
            }
        }
    };
}
