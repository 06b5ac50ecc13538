//! Endpoints: create, update and list; racing updates under the row lock; which destinations
//! are allowed; and their lifecycle (health, rotation, encryption at rest).

mod crud;
mod destinations;
mod health;
mod lifecycle;
mod races;
