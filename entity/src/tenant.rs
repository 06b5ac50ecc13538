//! `tenants`: the customers endpoints are grouped by; a tenant's partner keys manage its
//! endpoints, and a portal link signs one in to the console.

use sea_orm::entity::prelude::*;

/// One tenant.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "tenants")]
pub struct Model {
    /// Time-ordered (v7) id.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// Label chosen by the operator.
    pub name: String,
    /// When it was created.
    pub created_at: DateTimeUtc,
}

/// No relations.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
