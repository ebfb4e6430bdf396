//! Enough of PostgreSQL's system catalog for clients to find their way: `pg_catalog` tables
//! (namespaces, classes, attributes, types, …) describing Weft's tables with PostgreSQL type
//! OIDs, the catalog functions psql, Grafana and DBeaver call, and a rewrite of the
//! PostgreSQL-only syntax they send (`OPERATOR(pg_catalog.~)`, `COLLATE pg_catalog.default`,
//! `'spans'::regclass`, schema-qualified function names) into what DataFusion plans.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int64Array, ListBuilder, StringArray, StringBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::{MemTable, SchemaProvider, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{
    self, BinaryOperator, Expr, Ident, ObjectName, ObjectNamePart, Statement, Value, VisitMut,
    VisitorMut,
};

use super::columns::list_type;

pub const NS_PG_CATALOG: i64 = 11;
pub const NS_PUBLIC: i64 = 2200;
pub const NS_INFORMATION_SCHEMA: i64 = 13_000;
/// OID of the first of Weft's tables (PostgreSQL gives user relations OIDs from 16384).
pub const FIRST_TABLE_OID: i64 = 16_384;

/// PostgreSQL's type for an Arrow type: (OID, name as `format_type` prints it, typlen).
pub fn pg_type_of(t: &DataType) -> (i64, &'static str, i64) {
    match t {
        DataType::Boolean => (16, "boolean", 1),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => (21, "smallint", 2),
        DataType::Int32 | DataType::UInt16 => (23, "integer", 4),
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => (20, "bigint", 8),
        DataType::Float16 | DataType::Float32 => (700, "real", 4),
        DataType::Float64 => (701, "double precision", 8),
        // sent as float8 over the wire (see the PostgreSQL endpoint)
        DataType::Decimal128(_, _) | DataType::Decimal256(_, _) => (701, "double precision", 8),
        DataType::Timestamp(_, Some(_)) => (1184, "timestamp with time zone", 8),
        DataType::Timestamp(_, None) => (1114, "timestamp without time zone", 8),
        DataType::Date32 | DataType::Date64 => (1082, "date", 4),
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => (17, "bytea", -1),
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            match f.data_type() {
                DataType::Boolean => (1000, "boolean[]", -1),
                DataType::Int64 | DataType::Int32 | DataType::Int16 | DataType::Int8 => {
                    (1016, "bigint[]", -1)
                }
                DataType::Float64 | DataType::Float32 => (1022, "double precision[]", -1),
                DataType::Timestamp(_, _) => (1185, "timestamp with time zone[]", -1),
                _ => (1009, "text[]", -1),
            }
        }
        // maps and structs are sent as JSON text
        DataType::Dictionary(_, v) => pg_type_of(v),
        _ => (25, "text", -1),
    }
}

/// (oid, typname, typlen, typcategory, typelem, typarray) of the types Weft hands out.
const TYPES: &[(i64, &str, i64, &str, i64, i64)] = &[
    (16, "bool", 1, "B", 0, 1000),
    (17, "bytea", -1, "U", 0, 1001),
    (18, "char", 1, "Z", 0, 1002),
    (19, "name", 64, "S", 0, 1003),
    (20, "int8", 8, "N", 0, 1016),
    (21, "int2", 2, "N", 0, 1005),
    (23, "int4", 4, "N", 0, 1007),
    (25, "text", -1, "S", 0, 1009),
    (26, "oid", 4, "N", 0, 1028),
    (114, "json", -1, "U", 0, 199),
    (700, "float4", 4, "N", 0, 1021),
    (701, "float8", 8, "N", 0, 1022),
    (1043, "varchar", -1, "S", 0, 1015),
    (1082, "date", 4, "D", 0, 1182),
    (1114, "timestamp", 8, "D", 0, 1115),
    (1184, "timestamptz", 8, "D", 0, 1185),
    (1186, "interval", 16, "T", 0, 1187),
    (1700, "numeric", -1, "N", 0, 1231),
    (1000, "_bool", -1, "A", 16, 0),
    (1007, "_int4", -1, "A", 23, 0),
    (1009, "_text", -1, "A", 25, 0),
    (1016, "_int8", -1, "A", 20, 0),
    (1022, "_float8", -1, "A", 701, 0),
    (1185, "_timestamptz", -1, "A", 1184, 0),
];

/// The name `format_type(oid, typmod)` gives a type OID.
pub fn format_type(oid: i64) -> Option<&'static str> {
    Some(match oid {
        16 => "boolean",
        17 => "bytea",
        18 => "\"char\"",
        19 => "name",
        20 => "bigint",
        21 => "smallint",
        23 => "integer",
        25 => "text",
        26 => "oid",
        114 => "json",
        700 => "real",
        701 => "double precision",
        1043 => "character varying",
        1082 => "date",
        1114 => "timestamp without time zone",
        1184 => "timestamp with time zone",
        1186 => "interval",
        1700 => "numeric",
        1000 => "boolean[]",
        1007 => "integer[]",
        1009 => "text[]",
        1016 => "bigint[]",
        1022 => "double precision[]",
        1185 => "timestamp with time zone[]",
        _ => return None,
    })
}

/// A column spec: name and type code (`i` int64, `t` text, `b` bool, `f` float64, `l` text[]).
type Spec = &'static [(&'static str, char)];

/// A value of a catalog row.
#[derive(Clone, Debug)]
enum V {
    I(i64),
    T(String),
    B(bool),
    F(f64),
    Null,
}

fn t(s: &str) -> V {
    V::T(s.to_owned())
}

fn table(spec: Spec, rows: Vec<Vec<V>>) -> Result<Arc<dyn TableProvider>> {
    let fields: Vec<Field> = spec
        .iter()
        .map(|(n, c)| {
            let ty = match c {
                'i' => DataType::Int64,
                'b' => DataType::Boolean,
                'f' => DataType::Float64,
                'l' => list_type(),
                _ => DataType::Utf8,
            };
            Field::new(*n, ty, true)
        })
        .collect();
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let cols: Vec<ArrayRef> = spec
        .iter()
        .enumerate()
        .map(|(i, (_, c))| -> ArrayRef {
            let get = |r: &Vec<V>| r.get(i).cloned().unwrap_or(V::Null);
            match c {
                'i' => Arc::new(
                    rows.iter()
                        .map(|r| if let V::I(x) = get(r) { Some(x) } else { None })
                        .collect::<Int64Array>(),
                ),
                'b' => Arc::new(
                    rows.iter()
                        .map(|r| if let V::B(x) = get(r) { Some(x) } else { None })
                        .collect::<BooleanArray>(),
                ),
                'f' => Arc::new(
                    rows.iter()
                        .map(|r| if let V::F(x) = get(r) { Some(x) } else { None })
                        .collect::<Float64Array>(),
                ),
                'l' => {
                    let mut b = ListBuilder::new(StringBuilder::new());
                    for _ in &rows {
                        b.append(false);
                    }
                    Arc::new(b.finish())
                }
                _ => Arc::new(
                    rows.iter()
                        .map(|r| if let V::T(x) = get(r) { Some(x) } else { None })
                        .collect::<StringArray>(),
                ),
            }
        })
        .collect();
    let cols = cols
        .into_iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c)
            } else {
                arrow::compute::cast(&c, f.data_type())
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let batch = arrow::array::RecordBatch::try_new(schema.clone(), cols)?;
    Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
}

const PG_NAMESPACE: Spec = &[
    ("oid", 'i'),
    ("nspname", 't'),
    ("nspowner", 'i'),
    ("nspacl", 't'),
];
const PG_CLASS: Spec = &[
    ("oid", 'i'),
    ("relname", 't'),
    ("relnamespace", 'i'),
    ("reltype", 'i'),
    ("reloftype", 'i'),
    ("relowner", 'i'),
    ("relam", 'i'),
    ("relfilenode", 'i'),
    ("reltablespace", 'i'),
    ("relpages", 'i'),
    ("reltuples", 'f'),
    ("relallvisible", 'i'),
    ("reltoastrelid", 'i'),
    ("relhasindex", 'b'),
    ("relisshared", 'b'),
    ("relpersistence", 't'),
    ("relkind", 't'),
    ("relnatts", 'i'),
    ("relchecks", 'i'),
    ("relhasrules", 'b'),
    ("relhastriggers", 'b'),
    ("relhassubclass", 'b'),
    ("relrowsecurity", 'b'),
    ("relforcerowsecurity", 'b'),
    ("relispopulated", 'b'),
    ("relreplident", 't'),
    ("relispartition", 'b'),
    ("relrewrite", 'i'),
    ("relfrozenxid", 'i'),
    ("relminmxid", 'i'),
    ("relacl", 't'),
    ("reloptions", 'l'),
    ("relpartbound", 't'),
];
const PG_ATTRIBUTE: Spec = &[
    ("attrelid", 'i'),
    ("attname", 't'),
    ("atttypid", 'i'),
    ("attstattarget", 'i'),
    ("attlen", 'i'),
    ("attnum", 'i'),
    ("attndims", 'i'),
    ("attcacheoff", 'i'),
    ("atttypmod", 'i'),
    ("attbyval", 'b'),
    ("attalign", 't'),
    ("attstorage", 't'),
    ("attcompression", 't'),
    ("attnotnull", 'b'),
    ("atthasdef", 'b'),
    ("atthasmissing", 'b'),
    ("attidentity", 't'),
    ("attgenerated", 't'),
    ("attisdropped", 'b'),
    ("attislocal", 'b'),
    ("attinhcount", 'i'),
    ("attcollation", 'i'),
    ("attacl", 't'),
    ("attoptions", 'l'),
    ("attfdwoptions", 'l'),
    ("attmissingval", 't'),
];
const PG_TYPE: Spec = &[
    ("oid", 'i'),
    ("typname", 't'),
    ("typnamespace", 'i'),
    ("typowner", 'i'),
    ("typlen", 'i'),
    ("typbyval", 'b'),
    ("typtype", 't'),
    ("typcategory", 't'),
    ("typispreferred", 'b'),
    ("typisdefined", 'b'),
    ("typdelim", 't'),
    ("typrelid", 'i'),
    ("typsubscript", 'i'),
    ("typelem", 'i'),
    ("typarray", 'i'),
    ("typinput", 't'),
    ("typoutput", 't'),
    ("typreceive", 't'),
    ("typsend", 't'),
    ("typmodin", 't'),
    ("typmodout", 't'),
    ("typanalyze", 't'),
    ("typalign", 't'),
    ("typstorage", 't'),
    ("typnotnull", 'b'),
    ("typbasetype", 'i'),
    ("typtypmod", 'i'),
    ("typndims", 'i'),
    ("typcollation", 'i'),
    ("typdefaultbin", 't'),
    ("typdefault", 't'),
    ("typacl", 't'),
];
const PG_DATABASE: Spec = &[
    ("oid", 'i'),
    ("datname", 't'),
    ("datdba", 'i'),
    ("encoding", 'i'),
    ("datlocprovider", 't'),
    ("datistemplate", 'b'),
    ("datallowconn", 'b'),
    ("datconnlimit", 'i'),
    ("datfrozenxid", 'i'),
    ("datminmxid", 'i'),
    ("dattablespace", 'i'),
    ("datcollate", 't'),
    ("datctype", 't'),
    ("datacl", 't'),
];
const PG_AM: Spec = &[
    ("oid", 'i'),
    ("amname", 't'),
    ("amhandler", 't'),
    ("amtype", 't'),
];
const PG_SETTINGS: Spec = &[
    ("name", 't'),
    ("setting", 't'),
    ("unit", 't'),
    ("category", 't'),
    ("short_desc", 't'),
    ("extra_desc", 't'),
    ("context", 't'),
    ("vartype", 't'),
    ("source", 't'),
    ("min_val", 't'),
    ("max_val", 't'),
    ("boot_val", 't'),
    ("reset_val", 't'),
    ("pending_restart", 'b'),
];
const PG_ROLES: Spec = &[
    ("oid", 'i'),
    ("rolname", 't'),
    ("rolsuper", 'b'),
    ("rolinherit", 'b'),
    ("rolcreaterole", 'b'),
    ("rolcreatedb", 'b'),
    ("rolcanlogin", 'b'),
    ("rolreplication", 'b'),
    ("rolconnlimit", 'i'),
    ("rolpassword", 't'),
    ("rolvaliduntil", 't'),
    ("rolbypassrls", 'b'),
    ("rolconfig", 'l'),
];
const PG_USER: Spec = &[
    ("usename", 't'),
    ("usesysid", 'i'),
    ("usecreatedb", 'b'),
    ("usesuper", 'b'),
    ("userepl", 'b'),
    ("usebypassrls", 'b'),
    ("passwd", 't'),
    ("valuntil", 't'),
    ("useconfig", 'l'),
];
const PG_TABLES: Spec = &[
    ("schemaname", 't'),
    ("tablename", 't'),
    ("tableowner", 't'),
    ("tablespace", 't'),
    ("hasindexes", 'b'),
    ("hasrules", 'b'),
    ("hastriggers", 'b'),
    ("rowsecurity", 'b'),
];
const PG_VIEWS: Spec = &[
    ("schemaname", 't'),
    ("viewname", 't'),
    ("viewowner", 't'),
    ("definition", 't'),
];
const PG_MATVIEWS: Spec = &[
    ("schemaname", 't'),
    ("matviewname", 't'),
    ("matviewowner", 't'),
    ("tablespace", 't'),
    ("hasindexes", 'b'),
    ("ispopulated", 'b'),
    ("definition", 't'),
];
const PG_PROC: Spec = &[
    ("oid", 'i'),
    ("proname", 't'),
    ("pronamespace", 'i'),
    ("proowner", 'i'),
    ("prolang", 'i'),
    ("prokind", 't'),
    ("proretset", 'b'),
    ("prorettype", 'i'),
    ("proargtypes", 't'),
    ("proargnames", 'l'),
    ("prosrc", 't'),
];
const PG_DESCRIPTION: Spec = &[
    ("objoid", 'i'),
    ("classoid", 'i'),
    ("objsubid", 'i'),
    ("description", 't'),
];
const PG_INDEX: Spec = &[
    ("indexrelid", 'i'),
    ("indrelid", 'i'),
    ("indnatts", 'i'),
    ("indnkeyatts", 'i'),
    ("indisunique", 'b'),
    ("indisprimary", 'b'),
    ("indisexclusion", 'b'),
    ("indimmediate", 'b'),
    ("indisclustered", 'b'),
    ("indisvalid", 'b'),
    ("indisreplident", 'b'),
    ("indkey", 't'),
    ("indexprs", 't'),
    ("indpred", 't'),
];
const PG_CONSTRAINT: Spec = &[
    ("oid", 'i'),
    ("conname", 't'),
    ("connamespace", 'i'),
    ("contype", 't'),
    ("condeferrable", 'b'),
    ("condeferred", 'b'),
    ("convalidated", 'b'),
    ("conrelid", 'i'),
    ("contypid", 'i'),
    ("conindid", 'i'),
    ("conparentid", 'i'),
    ("confrelid", 'i'),
    ("conislocal", 'b'),
    ("coninhcount", 'i'),
    ("connoinherit", 'b'),
    ("conkey", 'l'),
    ("confkey", 'l'),
    ("conbin", 't'),
];
const PG_INHERITS: Spec = &[
    ("inhrelid", 'i'),
    ("inhparent", 'i'),
    ("inhseqno", 'i'),
    ("inhdetachpending", 'b'),
];
const PG_ATTRDEF: Spec = &[
    ("oid", 'i'),
    ("adrelid", 'i'),
    ("adnum", 'i'),
    ("adbin", 't'),
];
const PG_COLLATION: Spec = &[
    ("oid", 'i'),
    ("collname", 't'),
    ("collnamespace", 'i'),
    ("collprovider", 't'),
];
const PG_TRIGGER: Spec = &[
    ("oid", 'i'),
    ("tgrelid", 'i'),
    ("tgname", 't'),
    ("tgenabled", 't'),
    ("tgisinternal", 'b'),
    ("tgparentid", 'i'),
];
const PG_POLICY: Spec = &[
    ("oid", 'i'),
    ("polname", 't'),
    ("polrelid", 'i'),
    ("polcmd", 't'),
    ("polpermissive", 'b'),
    ("polroles", 'l'),
    ("polqual", 't'),
    ("polwithcheck", 't'),
];
const PG_REWRITE: Spec = &[
    ("oid", 'i'),
    ("rulename", 't'),
    ("ev_class", 'i'),
    ("ev_type", 't'),
];
const PG_STATISTIC_EXT: Spec = &[
    ("oid", 'i'),
    ("stxrelid", 'i'),
    ("stxname", 't'),
    ("stxnamespace", 'i'),
    ("stxkeys", 't'),
    ("stxkind", 'l'),
];
const PG_PUBLICATION: Spec = &[("oid", 'i'), ("pubname", 't'), ("puballtables", 'b')];
const PG_PUBLICATION_REL: Spec = &[("oid", 'i'), ("prpubid", 'i'), ("prrelid", 'i')];
const PG_PUBLICATION_NAMESPACE: Spec = &[("oid", 'i'), ("pnpubid", 'i'), ("pnnspid", 'i')];
const PG_PARTITIONED_TABLE: Spec = &[("partrelid", 'i'), ("partstrat", 't'), ("partnatts", 'i')];
const PG_FOREIGN_TABLE: Spec = &[("ftrelid", 'i'), ("ftserver", 'i')];
const PG_EXTENSION: Spec = &[
    ("oid", 'i'),
    ("extname", 't'),
    ("extowner", 'i'),
    ("extnamespace", 'i'),
    ("extversion", 't'),
];
const PG_ENUM: Spec = &[
    ("oid", 'i'),
    ("enumtypid", 'i'),
    ("enumsortorder", 'f'),
    ("enumlabel", 't'),
];
const PG_RANGE: Spec = &[("rngtypid", 'i'), ("rngsubtype", 'i')];
const PG_SEQUENCE: Spec = &[("seqrelid", 'i'), ("seqtypid", 'i')];
const PG_TABLESPACE: Spec = &[("oid", 'i'), ("spcname", 't'), ("spcowner", 'i')];
const PG_STAT_ACTIVITY: Spec = &[
    ("datid", 'i'),
    ("datname", 't'),
    ("pid", 'i'),
    ("usename", 't'),
    ("application_name", 't'),
    ("state", 't'),
    ("query", 't'),
];

/// The names of the catalog tables this module provides.
pub const PG_TABLE_NAMES: &[&str] = &[
    "pg_namespace",
    "pg_class",
    "pg_attribute",
    "pg_type",
    "pg_database",
    "pg_am",
    "pg_settings",
    "pg_roles",
    "pg_user",
    "pg_tables",
    "pg_views",
    "pg_matviews",
    "pg_proc",
    "pg_description",
    "pg_index",
    "pg_constraint",
    "pg_inherits",
    "pg_attrdef",
    "pg_collation",
    "pg_trigger",
    "pg_policy",
    "pg_rewrite",
    "pg_statistic_ext",
    "pg_publication",
    "pg_publication_rel",
    "pg_partitioned_table",
    "pg_foreign_table",
    "pg_extension",
    "pg_enum",
    "pg_range",
    "pg_sequence",
    "pg_tablespace",
    "pg_stat_activity",
    "pg_publication_namespace",
];

/// Weft's tables as the catalog describes them: (oid, name, columns).
#[derive(Clone, Debug)]
pub struct CatalogTables(pub Vec<(i64, String, SchemaRef)>);

/// The `pg_catalog` schema of one session.
#[derive(Debug)]
pub struct PgCatalog {
    tables: CatalogTables,
    database: String,
}

impl PgCatalog {
    pub fn new(tables: CatalogTables, database: String) -> Self {
        Self { tables, database }
    }

    fn build(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        let tables = &self.tables.0;
        let p = match name {
            "pg_namespace" => table(
                PG_NAMESPACE,
                vec![
                    vec![V::I(NS_PG_CATALOG), t("pg_catalog"), V::I(10)],
                    vec![V::I(NS_PUBLIC), t("public"), V::I(10)],
                    vec![
                        V::I(NS_INFORMATION_SCHEMA),
                        t("information_schema"),
                        V::I(10),
                    ],
                ],
            )?,
            "pg_class" => table(
                PG_CLASS,
                tables
                    .iter()
                    .map(|(oid, name, schema)| {
                        vec![
                            V::I(*oid),
                            t(name),
                            V::I(NS_PUBLIC),
                            V::I(0),
                            V::I(0),
                            V::I(10),
                            V::I(2),
                            V::I(*oid),
                            V::I(0),
                            V::I(0),
                            V::F(-1.0),
                            V::I(0),
                            V::I(0),
                            V::B(false),
                            V::B(false),
                            t("p"),
                            t("r"),
                            V::I(schema.fields().len() as i64),
                            V::I(0),
                            V::B(false),
                            V::B(false),
                            V::B(false),
                            V::B(false),
                            V::B(false),
                            V::B(true),
                            t("d"),
                            V::B(false),
                            V::I(0),
                            V::I(0),
                            V::I(0),
                        ]
                    })
                    .collect(),
            )?,
            "pg_attribute" => table(
                PG_ATTRIBUTE,
                tables
                    .iter()
                    .flat_map(|(oid, _, schema)| {
                        schema.fields().iter().enumerate().map(move |(i, f)| {
                            let (typ, _, len) = pg_type_of(f.data_type());
                            vec![
                                V::I(*oid),
                                t(f.name()),
                                V::I(typ),
                                V::I(-1),
                                V::I(len),
                                V::I(i as i64 + 1),
                                V::I(i64::from(matches!(f.data_type(), DataType::List(_)))),
                                V::I(-1),
                                V::I(-1),
                                V::B(len > 0),
                                t("d"),
                                t("x"),
                                t(""),
                                V::B(!f.is_nullable()),
                                V::B(false),
                                V::B(false),
                                t(""),
                                t(""),
                                V::B(false),
                                V::B(true),
                                V::I(0),
                                V::I(if typ == 25 { 100 } else { 0 }),
                            ]
                        })
                    })
                    .collect(),
            )?,
            "pg_type" => table(
                PG_TYPE,
                TYPES
                    .iter()
                    .map(|(oid, name, len, cat, elem, array)| {
                        vec![
                            V::I(*oid),
                            t(name),
                            V::I(NS_PG_CATALOG),
                            V::I(10),
                            V::I(*len),
                            V::B(*len > 0 && *len <= 8),
                            t("b"),
                            t(cat),
                            V::B(false),
                            V::B(true),
                            t(","),
                            V::I(0),
                            V::I(0),
                            V::I(*elem),
                            V::I(*array),
                            t(&format!("{name}in")),
                            t(&format!("{name}out")),
                            t(&format!("{name}recv")),
                            t(&format!("{name}send")),
                            t("-"),
                            t("-"),
                            t("-"),
                            t("i"),
                            t("p"),
                            V::B(false),
                            V::I(0),
                            V::I(-1),
                            V::I(0),
                            V::I(if *oid == 25 { 100 } else { 0 }),
                        ]
                    })
                    .collect(),
            )?,
            "pg_database" => table(
                PG_DATABASE,
                vec![vec![
                    V::I(16_383),
                    t(&self.database),
                    V::I(10),
                    V::I(6),
                    t("c"),
                    V::B(false),
                    V::B(true),
                    V::I(-1),
                    V::I(0),
                    V::I(0),
                    V::I(1663),
                    t("C.UTF-8"),
                    t("C.UTF-8"),
                ]],
            )?,
            "pg_am" => table(
                PG_AM,
                vec![vec![V::I(2), t("heap"), t("heap_tableam_handler"), t("t")]],
            )?,
            "pg_settings" => table(
                PG_SETTINGS,
                [
                    "server_version",
                    "server_version_num",
                    "TimeZone",
                    "DateStyle",
                    "client_encoding",
                    "server_encoding",
                    "standard_conforming_strings",
                    "integer_datetimes",
                    "search_path",
                    "max_identifier_length",
                    "transaction_read_only",
                ]
                .iter()
                .map(|n| vec![t(n), t(super::functions::setting(n).unwrap_or_default())])
                .collect(),
            )?,
            "pg_roles" => table(
                PG_ROLES,
                vec![vec![
                    V::I(10),
                    t("weft"),
                    V::B(false),
                    V::B(true),
                    V::B(false),
                    V::B(false),
                    V::B(true),
                    V::B(false),
                    V::I(-1),
                ]],
            )?,
            "pg_user" => table(
                PG_USER,
                vec![vec![
                    t("weft"),
                    V::I(10),
                    V::B(false),
                    V::B(false),
                    V::B(false),
                    V::B(false),
                ]],
            )?,
            "pg_tables" => table(
                PG_TABLES,
                tables
                    .iter()
                    .map(|(_, n, _)| {
                        vec![
                            t("public"),
                            t(n),
                            t("weft"),
                            V::Null,
                            V::B(false),
                            V::B(false),
                            V::B(false),
                            V::B(false),
                        ]
                    })
                    .collect(),
            )?,
            "pg_tablespace" => table(
                PG_TABLESPACE,
                vec![vec![V::I(1663), t("pg_default"), V::I(10)]],
            )?,
            "pg_stat_activity" => table(PG_STAT_ACTIVITY, Vec::new())?,
            other => {
                let spec = match other {
                    "pg_views" => PG_VIEWS,
                    "pg_matviews" => PG_MATVIEWS,
                    "pg_proc" => PG_PROC,
                    "pg_description" => PG_DESCRIPTION,
                    "pg_index" => PG_INDEX,
                    "pg_constraint" => PG_CONSTRAINT,
                    "pg_inherits" => PG_INHERITS,
                    "pg_attrdef" => PG_ATTRDEF,
                    "pg_collation" => PG_COLLATION,
                    "pg_trigger" => PG_TRIGGER,
                    "pg_policy" => PG_POLICY,
                    "pg_rewrite" => PG_REWRITE,
                    "pg_statistic_ext" => PG_STATISTIC_EXT,
                    "pg_publication" => PG_PUBLICATION,
                    "pg_publication_rel" => PG_PUBLICATION_REL,
                    "pg_publication_namespace" => PG_PUBLICATION_NAMESPACE,
                    "pg_partitioned_table" => PG_PARTITIONED_TABLE,
                    "pg_foreign_table" => PG_FOREIGN_TABLE,
                    "pg_extension" => PG_EXTENSION,
                    "pg_enum" => PG_ENUM,
                    "pg_range" => PG_RANGE,
                    "pg_sequence" => PG_SEQUENCE,
                    _ => return Ok(None),
                };
                table(spec, Vec::new())?
            }
        };
        Ok(Some(p))
    }
}

#[async_trait]
impl SchemaProvider for PgCatalog {
    fn table_names(&self) -> Vec<String> {
        PG_TABLE_NAMES.iter().map(|s| s.to_string()).collect()
    }
    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>, DataFusionError> {
        self.build(name)
    }
    fn table_exist(&self, name: &str) -> bool {
        PG_TABLE_NAMES.contains(&name)
    }
}

// ---------------------------------------------------------------------------------------
// functions

#[derive(Debug, PartialEq, Eq, Hash, Clone, Copy)]
enum PgFnKind {
    /// Returns its text constant whatever the arguments.
    Text(&'static str),
    NullText,
    True,
    FormatType,
    QuoteIdent,
    Int(i64),
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct PgFn {
    name: &'static str,
    kind: PgFnKind,
    signature: Signature,
}

impl ScalarUDFImpl for PgFn {
    fn name(&self) -> &str {
        self.name
    }
    fn signature(&self) -> &Signature {
        &self.signature
    }
    fn return_type(&self, _args: &[DataType]) -> Result<DataType> {
        Ok(match self.kind {
            PgFnKind::True => DataType::Boolean,
            PgFnKind::Int(_) => DataType::Int64,
            _ => DataType::Utf8,
        })
    }
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let scalar = |v: ScalarValue| Ok(ColumnarValue::Scalar(v));
        match self.kind {
            PgFnKind::Text(s) => scalar(ScalarValue::Utf8(Some(s.to_owned()))),
            PgFnKind::NullText => scalar(ScalarValue::Utf8(None)),
            PgFnKind::True => scalar(ScalarValue::Boolean(Some(true))),
            PgFnKind::Int(i) => scalar(ScalarValue::Int64(Some(i))),
            PgFnKind::FormatType | PgFnKind::QuoteIdent => {
                let arg = args.args.first().cloned().ok_or_else(|| {
                    DataFusionError::Plan(format!("{} needs an argument", self.name))
                })?;
                let array = arg.into_array(n)?;
                let out: StringArray = if self.kind == PgFnKind::FormatType {
                    let ints = arrow::compute::cast(&array, &DataType::Int64)?;
                    let ints = ints.as_any().downcast_ref::<Int64Array>().ok_or_else(|| {
                        DataFusionError::Internal("format_type: expected an oid".into())
                    })?;
                    ints.iter()
                        .map(|o| o.map(|o| format_type(o).unwrap_or("???").to_owned()))
                        .collect()
                } else {
                    let s = arrow::compute::cast(&array, &DataType::Utf8)?;
                    let s = s.as_any().downcast_ref::<StringArray>().ok_or_else(|| {
                        DataFusionError::Internal("quote_ident: expected text".into())
                    })?;
                    s.iter().map(|v| v.map(quote_ident)).collect()
                };
                Ok(ColumnarValue::Array(Arc::new(out)))
            }
        }
    }
}

/// An identifier quoted as PostgreSQL's `quote_ident` would.
pub fn quote_ident(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        s.to_owned()
    } else {
        format!("\"{}\"", s.replace('"', "\"\""))
    }
}

pub fn register(ctx: &SessionContext) {
    let f = |name: &'static str, kind: PgFnKind| {
        ScalarUDF::new_from_impl(PgFn {
            name,
            kind,
            signature: Signature::variadic_any(Volatility::Stable),
        })
    };
    for udf in [
        f("pg_get_userbyid", PgFnKind::Text("weft")),
        f("pg_encoding_to_char", PgFnKind::Text("UTF8")),
        f("pg_table_is_visible", PgFnKind::True),
        f("pg_type_is_visible", PgFnKind::True),
        f("pg_function_is_visible", PgFnKind::True),
        f("has_table_privilege", PgFnKind::True),
        f("has_schema_privilege", PgFnKind::True),
        f("has_database_privilege", PgFnKind::True),
        f("has_column_privilege", PgFnKind::True),
        f("pg_has_role", PgFnKind::True),
        f("pg_get_expr", PgFnKind::NullText),
        f("pg_get_indexdef", PgFnKind::NullText),
        f("pg_get_constraintdef", PgFnKind::NullText),
        f("pg_get_viewdef", PgFnKind::NullText),
        f("pg_get_partkeydef", PgFnKind::NullText),
        f("obj_description", PgFnKind::NullText),
        f("col_description", PgFnKind::NullText),
        f("shobj_description", PgFnKind::NullText),
        f("pg_tablespace_location", PgFnKind::Text("")),
        f("format_type", PgFnKind::FormatType),
        f("quote_ident", PgFnKind::QuoteIdent),
        f("pg_backend_pid", PgFnKind::Int(1)),
        f("txid_current", PgFnKind::Int(1)),
        f("inet_server_port", PgFnKind::Int(5433)),
    ] {
        ctx.register_udf(udf);
    }
}

// ---------------------------------------------------------------------------------------
// rewriting PostgreSQL-only syntax

struct PgRewriter<'a> {
    tables: &'a CatalogTables,
}

fn ident_is(i: &ObjectNamePart, name: &str) -> bool {
    matches!(i, ObjectNamePart::Identifier(id) if id.value.eq_ignore_ascii_case(name))
}

fn last_name(n: &ObjectName) -> Option<String> {
    match n.0.last()? {
        ObjectNamePart::Identifier(id) => Some(id.value.to_ascii_lowercase()),
        _ => None,
    }
}

impl VisitorMut for PgRewriter<'_> {
    type Break = ();

    fn pre_visit_relation(&mut self, relation: &mut ObjectName) -> std::ops::ControlFlow<()> {
        if relation.0.len() == 1
            && let Some(name) = last_name(relation)
            && PG_TABLE_NAMES.contains(&name.as_str())
        {
            relation
                .0
                .insert(0, ObjectNamePart::Identifier(Ident::new("pg_catalog")));
        }
        std::ops::ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> std::ops::ControlFlow<()> {
        let replace = match expr {
            Expr::Function(f) => {
                if f.name.0.len() == 2 && ident_is(&f.name.0[0], "pg_catalog") {
                    f.name.0.remove(0);
                }
                None
            }
            Expr::BinaryOp {
                op: BinaryOperator::PGCustomBinaryOperator(parts),
                ..
            } => {
                let op = match parts.last().map(String::as_str) {
                    Some("~") => Some(BinaryOperator::PGRegexMatch),
                    Some("~*") => Some(BinaryOperator::PGRegexIMatch),
                    Some("!~") => Some(BinaryOperator::PGRegexNotMatch),
                    Some("!~*") => Some(BinaryOperator::PGRegexNotIMatch),
                    Some("=") => Some(BinaryOperator::Eq),
                    Some("<>") => Some(BinaryOperator::NotEq),
                    Some("<") => Some(BinaryOperator::Lt),
                    Some(">") => Some(BinaryOperator::Gt),
                    Some("<=") => Some(BinaryOperator::LtEq),
                    Some(">=") => Some(BinaryOperator::GtEq),
                    _ => None,
                };
                if let (Some(op), Expr::BinaryOp { left, right, .. }) = (op, &*expr) {
                    Some(Expr::BinaryOp {
                        left: left.clone(),
                        op,
                        right: right.clone(),
                    })
                } else {
                    None
                }
            }
            Expr::Collate { expr: inner, .. } => Some((**inner).clone()),
            // subqueries over empty catalog tables: no rows, whatever they compute
            Expr::Subquery(q) if query_is_empty(q) => Some(Expr::value(Value::Null)),
            Expr::Exists { subquery, negated } if query_is_empty(subquery) => {
                Some(Expr::value(Value::Boolean(*negated)))
            }
            Expr::InSubquery {
                subquery, negated, ..
            } if query_is_empty(subquery) => Some(Expr::value(Value::Boolean(*negated))),
            Expr::Cast {
                expr: inner,
                data_type,
                ..
            } => {
                let type_name = data_type.to_string().to_ascii_lowercase();
                let type_name = type_name.trim_start_matches("pg_catalog.");
                match type_name {
                    "regclass" => Some(match &**inner {
                        Expr::Value(v) => match &v.value {
                            Value::SingleQuotedString(s) => {
                                let name = s.trim_start_matches("public.").trim_matches('"');
                                let oid = self
                                    .tables
                                    .0
                                    .iter()
                                    .find(|(_, n, _)| n == name)
                                    .map_or(0, |t| t.0);
                                Expr::value(Value::Number(oid.to_string(), false))
                            }
                            _ => (**inner).clone(),
                        },
                        _ => (**inner).clone(),
                    }),
                    "regtype" | "regproc" | "regprocedure" | "regnamespace" | "regrole" | "oid"
                    | "xid" => Some(cast(inner, ast::DataType::BigInt(None))),
                    "text" | "name" | "\"char\"" | "char" => Some(cast(inner, ast::DataType::Text)),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(r) = replace {
            *expr = r;
        }
        std::ops::ControlFlow::Continue(())
    }
}

fn cast(expr: &Expr, data_type: ast::DataType) -> Expr {
    Expr::Cast {
        kind: ast::CastKind::Cast,
        expr: Box::new(expr.clone()),
        data_type,
        array: false,
        format: None,
    }
}

/// Catalog tables that are always empty here (Weft has no indexes, constraints, triggers,
/// policies, inheritance, publications, …).
const EMPTY_TABLES: &[&str] = &[
    "pg_views",
    "pg_matviews",
    "pg_proc",
    "pg_description",
    "pg_index",
    "pg_constraint",
    "pg_inherits",
    "pg_attrdef",
    "pg_collation",
    "pg_trigger",
    "pg_policy",
    "pg_rewrite",
    "pg_statistic_ext",
    "pg_publication",
    "pg_publication_rel",
    "pg_publication_namespace",
    "pg_partitioned_table",
    "pg_foreign_table",
    "pg_extension",
    "pg_enum",
    "pg_range",
    "pg_sequence",
    "pg_stat_activity",
];

fn is_empty_table(f: &ast::TableFactor) -> bool {
    match f {
        ast::TableFactor::Table { name, .. } => {
            last_name(name).is_some_and(|n| EMPTY_TABLES.contains(&n.as_str()))
        }
        _ => false,
    }
}

/// Whether a SELECT reads no rows whatever its other clauses say: an empty catalog table is
/// cross- or inner-joined into its FROM.
fn select_is_empty(select: &ast::Select) -> bool {
    select.from.iter().any(|twj| {
        is_empty_table(&twj.relation)
            || twj.joins.iter().any(|j| {
                matches!(
                    j.join_operator,
                    ast::JoinOperator::Join(_)
                        | ast::JoinOperator::Inner(_)
                        | ast::JoinOperator::CrossJoin(_)
                ) && is_empty_table(&j.relation)
            })
    })
}

fn query_is_empty(q: &ast::Query) -> bool {
    match q.body.as_ref() {
        ast::SetExpr::Select(select) => select_is_empty(select),
        ast::SetExpr::Query(inner) => query_is_empty(inner),
        _ => false,
    }
}

/// Replaces SELECTs over empty catalog tables by `SELECT NULL AS name, …` over the same FROM
/// and nothing else: clients (psql's `\d`) send such queries with PostgreSQL-only expressions
/// (`array(select …)`, `polroles = '{0}'`) that would not plan, and their answer is no rows.
fn empty_selects(body: &mut ast::SetExpr) -> bool {
    match body {
        ast::SetExpr::Select(select) if select_is_empty(select) => {
            let projection = select
                .projection
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let alias = match item {
                        ast::SelectItem::ExprWithAlias { alias, .. } => alias.clone(),
                        ast::SelectItem::UnnamedExpr(Expr::Identifier(id)) => id.clone(),
                        ast::SelectItem::UnnamedExpr(Expr::CompoundIdentifier(ids)) => ids
                            .last()
                            .cloned()
                            .unwrap_or_else(|| Ident::new(format!("c{i}"))),
                        _ => Ident::new(format!("c{i}")),
                    };
                    ast::SelectItem::ExprWithAlias {
                        expr: Expr::value(Value::Null),
                        alias,
                    }
                })
                .collect();
            select.projection = projection;
            select.selection = None;
            select.having = None;
            select.group_by = ast::GroupByExpr::Expressions(Vec::new(), Vec::new());
            select.distinct = None;
            true
        }
        ast::SetExpr::SetOperation { left, right, .. } => {
            let l = empty_selects(left);
            let r = empty_selects(right);
            l || r
        }
        ast::SetExpr::Query(q) => {
            let empty = empty_selects(&mut q.body);
            if empty {
                q.order_by = None;
            }
            empty
        }
        _ => false,
    }
}

/// Rewrites PostgreSQL-only syntax of a statement into what DataFusion plans.
pub fn rewrite(statement: &mut Statement, tables: &CatalogTables) {
    if let Statement::Query(q) = statement
        && empty_selects(&mut q.body)
    {
        q.order_by = None;
    }
    let _ = statement.visit(&mut PgRewriter { tables });
}
