//! Reading deliveries and their attempts.

use entity::{delivery_attempt, webhook_delivery};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

use crate::auth::Identity;
use crate::db::Db;
use crate::error::Result;

/// Delivery read operations.
#[derive(Clone, Debug)]
pub struct Deliveries {
    db: Db,
}

impl Deliveries {
    /// Delivery operations on `db`.
    pub fn new(db: Db) -> Self {
        Deliveries { db }
    }

    /// One delivery, if it exists; `FORBIDDEN` outside a partner's scope.
    pub async fn get(
        &self,
        caller: &Identity,
        id: Uuid,
    ) -> Result<Option<webhook_delivery::Model>> {
        let found = self.load(id).await?;
        if let Some(found) = &found {
            caller.require_access(found.endpoint_id)?;
        }
        Ok(found)
    }

    /// One delivery by id, with no scope check: for fields of rows already checked.
    pub async fn load(&self, id: Uuid) -> Result<Option<webhook_delivery::Model>> {
        Ok(webhook_delivery::Entity::find_by_id(id)
            .one(self.db.conn())
            .await?)
    }

    /// The delivery of a submission, with no scope check.
    pub async fn load_for_submission(
        &self,
        submission_id: Uuid,
    ) -> Result<Option<webhook_delivery::Model>> {
        Ok(webhook_delivery::Entity::find()
            .filter(webhook_delivery::Column::SubmissionId.eq(submission_id))
            .one(self.db.conn())
            .await?)
    }

    /// Every attempt of a delivery, by lifetime number.
    pub async fn attempts(&self, delivery_id: Uuid) -> Result<Vec<delivery_attempt::Model>> {
        Ok(delivery_attempt::Entity::find()
            .filter(delivery_attempt::Column::DeliveryId.eq(delivery_id))
            .order_by_asc(delivery_attempt::Column::Number)
            .all(self.db.conn())
            .await?)
    }
}
