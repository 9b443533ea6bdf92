//! Images in the store (issue 42), on real SQLite files: a user message's images kept once per
//! distinct image and in order, read back after the store is opened again, carried through the
//! JSON export and import (checked against their hashes), referenced in Markdown, kept by an
//! edit, and deleted with the last conversation that shows them.

use rill_store::{image_hash, Error, NewMessage, Store};

mod common;
use common::{db, empty_conversation};

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n a small png";
const JPEG: &[u8] = b"\xff\xd8\xff\xe0 a small jpeg";

fn asking(images: &[&[u8]]) -> NewMessage {
    NewMessage {
        images: images.iter().map(|i| i.to_vec()).collect(),
        ..NewMessage::user("What is in these pictures?")
    }
}

async fn count(store: &Store, table: &str) -> i64 {
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", store.path().display()))
        .await
        .unwrap();
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
        .fetch_one(&pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_messages_images_are_kept_once_in_order_and_survive_a_restart() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let c = empty_conversation(&store).await;
    let m = store.append(c, asking(&[PNG, JPEG, PNG])).await.unwrap();
    let (png, jpeg) = (image_hash(PNG), image_hash(JPEG));
    assert_eq!(m.images, [png.clone(), jpeg.clone(), png.clone()]);
    store
        .append(c, NewMessage::assistant("Two pictures."))
        .await
        .unwrap();
    // The same picture in another conversation is not stored again.
    let other = empty_conversation(&store).await;
    store.append(other, asking(&[JPEG])).await.unwrap();
    assert_eq!(count(&store, "images").await, 2);
    drop(store);

    let store = Store::open(&path).await.unwrap();
    let path_ = store.current_path(c).await.unwrap();
    assert_eq!(path_[0].images, [png.clone(), jpeg.clone(), png.clone()]);
    assert!(path_[1].images.is_empty());
    let image = store.image(&jpeg).await.unwrap();
    assert_eq!(
        (image.bytes.as_slice(), image.media_type.as_str()),
        (JPEG, "image/jpeg")
    );
    assert_eq!(store.image(&png).await.unwrap().media_type, "image/png");
    assert!(matches!(
        store.image("0000").await,
        Err(Error::ImageNotFound(_))
    ));
    // An edit of the question shows the same pictures.
    let edited = store.edit(path_[0].id, "And these?").await.unwrap();
    assert_eq!(edited.images, path_[0].images);
    assert_eq!(count(&store, "images").await, 2);

    // Deleting one conversation keeps the picture the other shows.
    store.delete_conversation(c).await.unwrap();
    assert_eq!(count(&store, "images").await, 1);
    assert!(store.image(&jpeg).await.is_ok());
    store.delete_conversation(other).await.unwrap();
    assert_eq!(count(&store, "images").await, 0);
}

#[tokio::test]
async fn images_go_through_the_json_export_and_import_and_are_named_in_markdown() {
    let (_dir, path) = db();
    let store = Store::open(&path).await.unwrap();
    let c = empty_conversation(&store).await;
    store.append(c, asking(&[PNG, JPEG])).await.unwrap();
    store
        .append(c, NewMessage::assistant("A png and a jpeg."))
        .await
        .unwrap();
    let exported = store.export_json(c).await.unwrap();
    let file: serde_json::Value = serde_json::from_str(&exported).unwrap();
    assert_eq!(file["version"], rill_store::EXPORT_VERSION);
    assert_eq!(file["messages"][0]["images"][1], image_hash(JPEG));
    assert_eq!(file["images"][image_hash(PNG)]["media_type"], "image/png");
    let copy = store.import_json(&exported).await.unwrap();
    assert_eq!(store.export_json(copy).await.unwrap(), exported);
    let shown = &store.current_path(copy).await.unwrap()[0].images;
    assert_eq!(store.image(&shown[0]).await.unwrap().bytes, PNG);

    let md = store.export_markdown(c).await.unwrap();
    assert!(
        md.contains(&format!("(rill-image:{})", image_hash(PNG))),
        "{md}"
    );

    // A damaged image, or one a message names and the file lacks: nothing is imported.
    let before = store.list_conversations(true).await.unwrap().len();
    let mut bad = file.clone();
    bad["images"][image_hash(PNG)]["data"] = "AAAA".into();
    let err = store.import_json(&bad.to_string()).await.unwrap_err();
    assert!(err.to_string().contains("do not have that hash"), "{err}");
    let mut missing = file.clone();
    missing["images"]
        .as_object_mut()
        .unwrap()
        .remove(&image_hash(JPEG));
    let err = store.import_json(&missing.to_string()).await.unwrap_err();
    assert!(err.to_string().contains("does not hold"), "{err}");
    assert_eq!(store.list_conversations(true).await.unwrap().len(), before);
}
