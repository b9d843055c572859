-- The open-chat quota counts a tenant's open chats in the store on every creation: this
-- index holds only open chats, so the count does not read the tenant's completed ones.
CREATE INDEX chats_open_by_tenant ON chats (tenant) WHERE status <> 'completed';
