//! Lists and maps shared by reference inside CEL values.
//!
//! The `cel` crate's interpreter owns what it binds: each element a comprehension visits
//! (`containers.all(c, ...)`), each field an optional selection reads (`c.?securityContext`)
//! and each operand of a list `+` is cloned, and cloning its built-in list or map copies the
//! whole subtree. For admission requests that is most of the work (a Pod's containers were
//! copied once per loop per policy). [`SharedVal`] holds a list or map behind an `Arc` and
//! answers every `Val` question by asking it, so cloning one is a reference count, while the
//! interpreter, the functions and the conversions still see the built-in list or map (it
//! identifies itself as that built-in). Nothing in the crate offers this; it is the one
//! wrapper the `Val` trait was opened for ("an application's own type").

use cel::ExecutionError;
use cel::common::traits::{
    Adder, Comparer, Container, Divider, Indexer, Iterable, Modder, Multiplier, Negator, Sizer, Subtractor, Zeroer,
};
use cel::common::types::{CelList, CelMap, CelMapKey, CelOptional, CelString, Type};
use cel::common::value::{Builtin, BuiltinRef, CowVal, Val};
use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

/// A built-in list or map (with `'static` contents), shared.
#[derive(Debug, Clone)]
pub(crate) struct SharedVal(Arc<dyn Val>);

impl SharedVal {
    /// Shares `v` when it is a list or map; other values are cheap to clone as they are.
    pub(crate) fn wrap(v: Box<dyn Val>) -> Box<dyn Val> {
        match v.as_builtin() {
            BuiltinRef::List(_) | BuiltinRef::Map(_) => Box::new(SharedVal(Arc::from(v))),
            _ => v,
        }
    }
}

/// The `Val` accessors that hand out the value's operator traits, each answered by the shared
/// value: `bound` ones carry the trait object's lifetime, the others do not.
macro_rules! delegate_accessors {
    (bound: $($bound:ident => $btrait:ident),*; plain: $($plain:ident => $ptrait:ident),*) => {
        $(
            fn $bound<'b, 'v>(&'b self) -> Option<&'b (dyn $btrait + 'v)>
            where
                Self: 'v,
            {
                self.0.$bound()
            }
        )*
        $(
            fn $plain(&self) -> Option<&dyn $ptrait> {
                self.0.$plain()
            }
        )*
    };
}

impl Val for SharedVal {
    fn get_type(&self) -> &Type {
        self.0.get_type()
    }

    fn cel_type() -> &'static Type
    where
        Self: Sized,
    {
        // Never named in an overload (the crate's macros are the only callers): the dynamic
        // type is the honest static answer for a value that is a list or a map.
        &cel::common::types::DYN_TYPE
    }

    delegate_accessors!(
        bound: as_adder => Adder, as_divider => Divider, as_indexer => Indexer, as_iterable => Iterable,
            as_modder => Modder, as_multiplier => Multiplier, as_negator => Negator, as_subtractor => Subtractor;
        plain: as_comparer => Comparer, as_container => Container, as_sizer => Sizer, as_zeroer => Zeroer
    );

    fn into_indexer<'v>(self: Box<Self>) -> Option<Box<dyn Indexer + 'v>>
    where
        Self: 'v,
    {
        // The interpreter moves elements out of owned built-ins; a shared one lends them.
        Some(self)
    }

    fn equals(&self, other: &dyn Val) -> bool {
        self.0.equals(other)
    }

    fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
    where
        Self: 'v,
    {
        Box::new(self.clone())
    }

    fn as_any(&self) -> Option<&dyn Any> {
        Some(self)
    }

    fn as_builtin<'b, 'v>(&'b self) -> BuiltinRef<'b, 'v>
    where
        Self: 'v,
    {
        self.0.as_builtin()
    }

    fn into_builtin<'v>(self: Box<Self>) -> Option<Builtin<'v>>
    where
        Self: 'v,
    {
        // Moving out of a shared value copies its top level (the elements stay shared).
        self.0.clone_as_boxed().into_builtin()
    }
}

impl cel::common::value::StaticVal for SharedVal {}

impl Indexer for SharedVal {
    fn get<'b, 'v>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'v>, ExecutionError>
    where
        Self: 'v,
    {
        match self.0.as_indexer() {
            Some(i) => i.get(idx),
            None => Err(ExecutionError::function_error("index", "the value cannot be indexed")),
        }
    }

    fn steal<'v>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'v>, ExecutionError>
    where
        Self: 'v,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

/// A `'static` copy of `v` in which lists and maps are shared: what a composition variable
/// keeps. A value already shared is not copied at all, so a variable built from the request's
/// lists (`object.spec.containers + ...`) holds references to the request's containers.
pub(crate) fn to_static(v: &dyn Val) -> Result<Box<dyn Val>, ExecutionError> {
    if let Some(s) = v.as_any().and_then(|a| a.downcast_ref::<SharedVal>()) {
        return Ok(Box::new(s.clone()));
    }
    Ok(match v.as_builtin() {
        BuiltinRef::List(l) => {
            let items = l.inner().iter().map(|i| to_static(i.as_ref())).collect::<Result<Vec<_>, _>>()?;
            SharedVal::wrap(Box::new(CelList::from(items)))
        }
        BuiltinRef::Map(m) => {
            let entries = m
                .inner()
                .iter()
                .map(|(k, v)| Ok((k.clone().into_static(), to_static(v.as_ref())?)))
                .collect::<Result<HashMap<CelMapKey<'static>, _>, ExecutionError>>()?;
            SharedVal::wrap(Box::new(CelMap::from(entries)))
        }
        BuiltinRef::String(s) => Box::new(CelString::from(s.inner().to_string())),
        BuiltinRef::Optional(o) => Box::new(match o.option() {
            Some(inner) => CelOptional::of(to_static(inner)?),
            None => CelOptional::none(),
        }),
        // Scalars, bytes, structs and opaque values: through the crate's own conversions.
        _ => Box::<dyn Val>::try_from(cel::Value::try_from(v)?)?,
    })
}
