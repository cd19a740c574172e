/* forms.h: the form builders, one file each in this folder; mg_plan_build (mg_plan.c)
 * dispatches on the plan's form to one of them. Each records its steps into p through
 * mg_plan_builder.h. */
#ifndef MG_FORMS_H
#define MG_FORMS_H
#include "mg_plan.h"

void mg_form_explicit(mg_plan *p);
void mg_form_absorbed(mg_plan *p);
void mg_form_laga(mg_plan *p, int recompute);
void mg_form_laga_fused(mg_plan *p);
void mg_form_laga_cp(mg_plan *p);
#endif
