//! Reading deliveries and their attempts.

use entity::{delivery_attempt, webhook_delivery};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, Statement};
use uuid::Uuid;

use crate::auth::Identity;
use crate::db::{self, Db};
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

    /// How many deliveries are due now (waiting to be claimed), for the queue-depth gauge.
    pub async fn due_count(&self) -> Result<i64> {
        const DUE_COUNT: &str = "SELECT COUNT(*) AS due FROM webhook_deliveries \
             WHERE state IN ('pending', 'processing') AND next_attempt_at <= $1";
        let row = self
            .db
            .conn()
            .query_one_raw(Statement::from_sql_and_values(
                self.db.backend(),
                DUE_COUNT,
                [db::now().into()],
            ))
            .await?;
        Ok(row
            .map(|row| row.try_get::<i64>("", "due"))
            .transpose()?
            .unwrap_or(0))
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
