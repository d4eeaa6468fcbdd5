// Event shapes shared by this function's modules. Types only: esbuild strips
// them, so nothing of this file is left at runtime.
export interface OrderLine {
  sku: string;
  quantity: number;
  unit_price: number;
}

export interface OrderCreated {
  type: "order.created";
  order_id: string;
  customer: { name: string; email: string };
  lines: OrderLine[];
}
